"""The sandbox's limits: each bad program ends with its outcome and reason, the caller goes on, and nothing outside
the run's directory changes or keeps running. Every test runs under our own launcher ("plain") and, where it is
installed, under bubblewrap.

Limits are small so the suite is quick; the wall clock is short (1.5 s) only where the program is meant to run
out of it, and generous elsewhere so that a loaded machine cannot turn a fast crash into a timeout.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path
from typing import cast

import pytest

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.sandbox import Outcome, Sandbox, SandboxConfig, SandboxResult
from tinker_cookbook.sandbox import isolation as iso


@pytest.fixture(params=["plain", "bwrap"])
def mode(request: pytest.FixtureRequest) -> iso.IsolationMode:
    if request.param == "bwrap" and iso.bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap) or cannot make namespaces here")
    return cast(iso.IsolationMode, request.param)


def skip_unless(mode: iso.IsolationMode, capability: str, why: str) -> None:
    """Skip a plain-isolation test on a machine that lacks ``capability`` (an ``Isolation`` property); the docs
    (docs/code-rl.md) list these gaps."""
    if not getattr(iso.isolation_for(mode), capability):
        pytest.skip(f"plain isolation here: {iso.isolation_for(mode).describe()}; {why}")


def run(mode: iso.IsolationMode, root: Path, code: str, stdin: bytes = b"", wall_s: float = 20.0) -> SandboxResult:
    config = SandboxConfig(isolation=mode, wall_s=wall_s, cpu_s=1, memory_mb=256, max_output_bytes=4096,
                           max_file_bytes=1 << 20)
    root.mkdir(exist_ok=True)
    return asyncio.run(Sandbox(config, root_dir=str(root)).run(code, stdin=stdin))


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if text.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def wait_until_gone(text: str, patience_s: float = 5.0) -> list[int]:
    """The processes mentioning ``text`` still alive after ``patience_s`` (killing is asynchronous)."""
    deadline = time.monotonic() + patience_s
    while (left := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_good_program_runs_with_its_stdin_in_a_removed_directory(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "import os, sys\nprint(sum(map(int, sys.stdin.read().split())))\n"
                 "open('scratch.txt', 'w').write('fine')\nprint(os.listdir('.'))", stdin=b"1 2 3")
    assert result.outcome == Outcome.OK, result
    assert result.stdout.splitlines()[0] == "6" and "scratch.txt" in result.stdout
    assert result.exit_code == 0 and result.reason == "exited normally"
    assert list((tmp_path / "runs").iterdir()) == []


def test_an_infinite_loop_times_out(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "while True:\n    pass", wall_s=1.5)
    assert result.outcome == Outcome.TIMEOUT, result
    assert "CPU time" in result.reason or "wall clock" in result.reason


def test_sleeping_forever_times_out_on_the_wall_clock(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "import time\ntime.sleep(1000)", wall_s=1.5)
    assert result.outcome == Outcome.TIMEOUT and "wall clock" in result.reason, result
    assert result.exit_code is None


def test_unbounded_allocation_runs_out_of_memory(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))")
    assert result.outcome == Outcome.MEMORY, result
    assert "256 MiB" in result.reason


def test_a_fork_bomb_is_stopped_and_leaves_nothing_behind(mode, tmp_path):
    skip_unless(mode, "contains_escapees", "without PID namespaces or a pids cgroup leftovers are not guaranteed")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run(mode, tmp_path / "runs", bomb, wall_s=1.5)
    assert result.outcome == Outcome.TIMEOUT, result
    assert wait_until_gone(str(tmp_path)) == []
    assert run(mode, tmp_path / "runs", "print('still works')").stdout == "still works\n"


def test_a_setsid_double_fork_does_not_outlive_the_run(mode, tmp_path):
    skip_unless(mode, "contains_escapees", "without PID namespaces or a pids cgroup an escapee can outlive the run")
    token = f"escapee-{uuid.uuid4().hex}"
    code = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{token}"])
    os._exit(0)
os.wait()
print("parent done")
"""
    result = run(mode, tmp_path / "runs", code)
    assert result.outcome == Outcome.OK and result.stdout == "parent done\n", result
    assert wait_until_gone(token) == []


def test_writes_outside_the_directory_change_nothing(mode, tmp_path):
    skip_unless(mode, "landlock", "without Landlock a plain run can write wherever its user can; use bubblewrap")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("original")
    stray = Path("/tmp") / f"sandbox-stray-{uuid.uuid4().hex}"
    code = f"""
import os, shutil
attempts = [
    lambda: open({str(outside / 'keep.txt')!r}, 'w').write('overwritten'),
    lambda: open({str(outside / 'new.txt')!r}, 'w').write('new'),
    lambda: os.remove({str(outside / 'keep.txt')!r}),
    lambda: os.mkdir({str(outside / 'newdir')!r}),
    lambda: open('../sibling.txt', 'w').write('x'),
    lambda: open({str(stray)!r}, 'w').write('x'),
    lambda: shutil.rmtree({str(outside)!r}),
]
for attempt in attempts:
    try:
        attempt()
    except OSError:
        pass
open('inside.txt', 'w').write('allowed')
print(open('inside.txt').read())
"""
    result = run(mode, tmp_path / "runs", code)
    assert result.outcome == Outcome.OK and result.stdout == "allowed\n", result
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "original"
    assert not stray.exists()
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_printing_gigabytes_is_cut_off(mode, tmp_path, stream):
    code = f"import sys\nchunk = 'x' * 65536\nwhile True:\n    sys.{stream}.write(chunk)"
    result = run(mode, tmp_path / "runs", code)
    assert result.outcome == Outcome.OUTPUT_LIMIT and "4096 bytes" in result.reason, result
    assert len(getattr(result, stream)) <= 4096


def test_writing_a_huge_file_is_cut_off(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "f = open('big.bin', 'wb')\nwhile True:\n    f.write(b'x' * 65536)")
    assert result.outcome == Outcome.OUTPUT_LIMIT and "larger than 1048576 bytes" in result.reason, result


def test_the_network_is_unreachable(mode, tmp_path):
    skip_unless(mode, "blocks_network", "without a network namespace or Landlock 4+ the network is reachable")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    code = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as exc:
    print("blocked:", exc)
"""
    try:
        result = run(mode, tmp_path / "runs", code)
    finally:
        listener.close()
    assert result.outcome == Outcome.OK and result.stdout.startswith("blocked"), result


def test_a_segfault_is_a_crash(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "import ctypes\nctypes.string_at(0)")
    assert result.outcome == Outcome.CRASH and "SIGSEGV" in result.reason, result


def test_an_exception_is_a_crash_with_its_message(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "raise ValueError('bad input')")
    assert result.outcome == Outcome.CRASH and "ValueError: bad input" in result.reason, result
    assert result.exit_code == 1


def test_bad_programs_side_by_side_do_not_stop_a_good_one(mode, tmp_path):
    # 3 s of wall clock: enough for the good program to start on a loaded machine while a bad one holds a slot.
    config = SandboxConfig(isolation=mode, wall_s=3.0, cpu_s=1, memory_mb=256, max_concurrency=2)
    sandbox = Sandbox(config, root_dir=str(tmp_path))

    async def batch() -> list[SandboxResult]:
        codes = ["while True: pass", "import os\nwhile True:\n    os.fork() if True else None", "print('ok')",
                 "import sys\nwhile True: sys.stdout.write('y' * 65536)"]
        return await asyncio.gather(*(sandbox.run(code) for code in codes))

    results = asyncio.run(batch())
    assert [r.outcome for r in results][2] == Outcome.OK and results[2].stdout == "ok\n"
    assert results[0].outcome == Outcome.TIMEOUT and results[3].outcome == Outcome.OUTPUT_LIMIT
    assert results[1].outcome in (Outcome.TIMEOUT, Outcome.CRASH)
    if iso.isolation_for(mode).contains_escapees:
        assert wait_until_gone(str(tmp_path)) == []


def test_asking_for_bubblewrap_where_it_is_missing_names_the_fix(monkeypatch):
    monkeypatch.setattr(iso, "bwrap_path", lambda: None)
    with pytest.raises(ConfigurationError, match="apt-get install bubblewrap"):
        iso.isolation_for("bwrap")
    assert iso.isolation_for("auto").mode == "plain"


@pytest.mark.parametrize("field, value", [("wall_s", 0), ("memory_mb", 16), ("max_concurrency", 0)])
def test_bad_limits_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SandboxConfig(**{field: value})


def test_the_run_directory_is_the_only_writable_place_even_for_the_environment(mode, tmp_path):
    result = run(mode, tmp_path / "runs", "import os, tempfile\nprint(os.environ['HOME'] == os.getcwd(), "
                 "tempfile.gettempdir() == os.getcwd(), sorted(os.environ))")
    assert result.stdout.startswith("True True"), result
    assert "PYTHONPATH" not in result.stdout and "TINKER" not in result.stdout


def test_an_interpreter_under_tmp_still_runs_inside_bubblewrap(monkeypatch, tmp_path):
    # A checkout (and its .venv) under /tmp: bubblewrap's fresh /tmp would hide the interpreter, so every run crashed
    # with "execvp ... No such file or directory". The interpreter's directory is bound back, read-only.
    if iso.bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap) or cannot make namespaces here")
    import shutil
    import sys
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="sandbox-python-", dir="/tmp"))
    try:
        (home / "bin").mkdir()
        (home / "bin" / "python").symlink_to(sys.executable)
        monkeypatch.setattr(sys, "executable", str(home / "bin" / "python"))
        result = run("bwrap", tmp_path / "runs", "import sys\nprint(sys.executable)\nopen(sys.executable + '.x', 'w')")
    finally:
        shutil.rmtree(home)
    assert result.outcome == Outcome.CRASH and result.stdout == f"{home}/bin/python\n", result
    assert "Read-only file system" in result.stderr, result  # seen, but not writable


def test_only_the_outermost_interpreter_directories_under_tmp_are_kept(monkeypatch):
    monkeypatch.setattr(iso.sys, "prefix", "/tmp/checkout/.venv")
    monkeypatch.setattr(iso.sys, "base_prefix", "/usr")
    assert iso.interpreter_paths_under_tmp("/tmp/checkout/.venv/bin/python") == ["/tmp/checkout/.venv"]
    monkeypatch.setattr(iso.sys, "prefix", "/opt/venv")
    assert iso.interpreter_paths_under_tmp("/usr/bin/python3") == []
