"""Run untrusted Python in a confined, time- and size-limited process, without blocking the event loop.

    sandbox = Sandbox(SandboxConfig(wall_s=2.0))
    result = await sandbox.run("print(sum(range(10)))")
    result.outcome, result.stdout          # Outcome.OK, "45\\n"

Each run gets a fresh directory (its working directory, removed afterwards), a minimal environment, its own
session and process group, the resource limits of ``SandboxConfig`` and the isolation of
``tinker_cookbook.sandbox.isolation``. Whatever the program does, ``run`` returns within about ``wall_s`` with an
``Outcome`` and a reason; it never raises because of the program. See docs/code-rl.md for what this protects
against and what it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

import chz

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.sandbox import isolation as iso

_MB = 1024 * 1024
_READ_CHUNK = 65536
_POLL_S = 0.05
"""How often the watcher checks whether the launcher has exited while its pipes are still open."""
_PIPE_GRACE_S = 0.5
"""How long to wait for the output pipes to close after the process group is killed: a process that escaped the
group and the namespaces (only possible without PID namespaces) may hold them open forever."""


class Outcome(StrEnum):
    OK = "ok"
    """Exited with status 0."""
    TIMEOUT = "timeout"
    """Ran past the wall clock or used up its CPU time."""
    MEMORY = "memory"
    """Ran out of its address space (MemoryError)."""
    OUTPUT_LIMIT = "output_limit"
    """Printed or wrote more than allowed."""
    CRASH = "crash"
    """Any other failure: a non-zero exit (an exception), a signal (a segfault), a sandbox that could not start."""


@dataclass(frozen=True)
class SandboxResult:
    outcome: Outcome
    reason: str
    """Why the run ended, in words (for transcripts)."""
    exit_code: int | None
    """The program's exit status (128 + N for signal N); None when it was killed for time or output."""
    stdout: str
    stderr: str
    """Each cut to ``max_output_bytes``, decoded as UTF-8 with replacement characters."""
    wall_s: float


@chz.chz
class SandboxConfig:
    """Limits and isolation of sandboxed runs (``Sandbox``)."""

    isolation: iso.IsolationMode = "auto"
    """``bwrap``: bubblewrap (error when missing); ``plain``: our launcher only; ``auto``: bubblewrap where it works."""
    wall_s: float = 5.0
    """Wall-clock seconds before the run's whole process tree is killed."""
    cpu_s: int = 4
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address space per process in MiB (RLIMIT_AS)."""
    max_output_bytes: int = 65536
    """Most bytes read from stdout and from stderr; more kills the run."""
    max_file_bytes: int = 8 * _MB
    """Largest file the program may write (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_processes: int = 32
    """Processes in the run's pids cgroup (where the machine lets us make one)."""
    max_concurrency: int = 2
    """Runs at a time per ``Sandbox``; more wait their turn."""

    @chz.validate
    def _check(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_output_bytes", "max_file_bytes", "max_open_files",
                     "max_processes", "max_concurrency"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"sandbox {name}={getattr(self, name)} must be positive")
        if self.memory_mb < 64:
            raise ConfigurationError(f"sandbox memory_mb={self.memory_mb} is too small for Python to start; use 64+")


def rlimits(config: SandboxConfig) -> dict[str, list[int]]:
    """The launcher's resource limits: (soft, hard) per ``resource`` name. The CPU hard limit is one second above
    the soft one, so the program first gets SIGXCPU (reported as a timeout) and SIGKILL only if it ignores that."""
    memory = config.memory_mb * _MB
    return {
        "RLIMIT_CPU": [config.cpu_s, config.cpu_s + 1],
        "RLIMIT_AS": [memory, memory],
        "RLIMIT_FSIZE": [config.max_file_bytes, config.max_file_bytes],
        "RLIMIT_NOFILE": [config.max_open_files, config.max_open_files],
        "RLIMIT_CORE": [0, 0],
    }


def _environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0"}


class Sandbox:
    """Runs programs with ``config``'s limits, at most ``max_concurrency`` at a time (per event loop)."""

    def __init__(self, config: SandboxConfig | None = None, root_dir: str | None = None) -> None:
        self.config = config or SandboxConfig()
        self.isolation = iso.isolation_for(self.config.isolation)
        self.root_dir = root_dir
        """Where the runs' directories are made (None: the system's temporary directory)."""
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_semaphores": {}}  # semaphores belong to one process's event loops

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores = {loop: asyncio.Semaphore(self.config.max_concurrency)}
        return self._semaphores[loop]

    async def run(self, code: str, *, stdin: bytes = b"", files: Mapping[str, str] | None = None) -> SandboxResult:
        """Run ``code`` as ``main.py`` (next to ``files``, name -> text) with ``stdin`` as its standard input."""
        async with self._semaphore():
            workdir = tempfile.mkdtemp(prefix="tinker-sandbox-", dir=self.root_dir)
            try:
                for name, text in {**(files or {}), "main.py": code}.items():
                    Path(workdir, name).write_text(text)
                return await asyncio.to_thread(self._run_in, workdir, stdin)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    def _plan(self, workdir: str, cgroup: str | None) -> dict[str, object]:
        program = [sys.executable, *iso.PYTHON_FLAGS, os.path.join(workdir, "main.py")]
        bwrap = self.isolation.mode == "bwrap"
        return {
            "mode": self.isolation.mode,
            "argv": iso.bwrap_argv(workdir, program) if bwrap else program,
            "cgroup": cgroup,
            "rlimits": rlimits(self.config),
            "namespaces": bool(self.isolation.namespaces),
            "require_namespaces": bool(self.isolation.namespaces),
            "require_landlock": self.isolation.landlock,
        }

    def _run_in(self, workdir: str, stdin: bytes) -> SandboxResult:
        """Blocking: start the launcher, watch it, kill its group. Runs in a worker thread (``run``), because
        asyncio's ``Process.wait`` also waits for the output pipes, which a killed run's leftovers may hold."""
        cgroup = None
        if self.isolation.cgroup_base is not None:
            # A few more than max_processes: the launcher, the init process and bubblewrap count too.
            cgroup = iso.make_cgroup(self.isolation.cgroup_base, self.config.max_processes + 4)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [sys.executable, *iso.PYTHON_FLAGS, iso.LAUNCHER, json.dumps(self._plan(workdir, cgroup))],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=workdir, env=_environment(workdir), start_new_session=True)
            try:
                watch = _watch(proc, stdin, self.config.max_output_bytes, start + self.config.wall_s)
            finally:
                # Always: whatever the program left behind in its process group goes too.
                _kill_group(proc.pid)
                exit_code = proc.wait()
        finally:
            if cgroup is not None:
                iso.remove_cgroup(cgroup)
        stdout, stderr = (b.decode("utf-8", "replace") for b in watch.output)
        outcome, reason = classify(self.config, exit_code, watch.timed_out, watch.overflowed, stderr)
        cut_short = watch.timed_out or watch.overflowed
        return SandboxResult(outcome, reason, None if cut_short else _as_status(exit_code), stdout, stderr,
                             time.monotonic() - start)


@dataclass
class _Watch:
    output: list[bytes]
    """stdout, stderr (each at most the cap)."""
    timed_out: bool = False
    overflowed: bool = False


def _watch(proc: subprocess.Popen[bytes], stdin: bytes, cap: int, deadline: float) -> _Watch:
    """Feed stdin and read both outputs until the program exits and its pipes close, the output passes ``cap``
    or the clock passes ``deadline``. A process that escaped the group may keep the pipes open: once the launcher
    has exited, the pipes get ``_PIPE_GRACE_S`` more."""
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    watch = _Watch([b"", b""])
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        pending = memoryview(stdin)
        stdin_fd = -1
        if proc.stdin is not None:
            stdin_fd = proc.stdin.fileno()
            os.set_blocking(stdin_fd, False)
            selector.register(stdin_fd, selectors.EVENT_WRITE)
        exited_at: float | None = None
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                watch.timed_out = True
                break
            if exited_at is not None and now - exited_at > _PIPE_GRACE_S:
                break
            for key, _ in selector.select(min(deadline - now, _POLL_S)):
                if key.fd == stdin_fd:
                    assert proc.stdin is not None
                    pending = _write_some(proc.stdin, pending, selector)
                    continue
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                buffers[key.fd] += chunk
                if len(buffers[key.fd]) > cap:
                    watch.overflowed = True
            if watch.overflowed:
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if not (watch.timed_out or watch.overflowed):
        try:  # the pipes closed, but the program may still be running
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            watch.timed_out = True
    watch.output = [bytes(buffers[proc.stdout.fileno()][:cap]), bytes(buffers[proc.stderr.fileno()][:cap])]
    proc.stdout.close()
    proc.stderr.close()
    return watch


def _write_some(pipe: IO[bytes], pending: memoryview, selector: selectors.BaseSelector) -> memoryview:
    """Write what the pipe takes now; close it when all is written or the program stopped reading."""
    try:
        pending = pending[os.write(pipe.fileno(), pending[:_READ_CHUNK]):]
    except BlockingIOError:
        return pending
    except OSError:  # the program closed its stdin or exited
        pending = pending[:0]
    if not pending:
        selector.unregister(pipe.fileno())
        pipe.close()
    return pending


def _as_status(exit_code: int) -> int:
    return 128 - exit_code if exit_code < 0 else exit_code  # a signal seen directly (-N) as the launcher reports it


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def classify(config: SandboxConfig, exit_code: int, timed_out: bool, overflowed: bool, stderr: str
             ) -> tuple[Outcome, str]:
    """The outcome of a finished run and its reason, from how it ended."""
    if overflowed:
        return Outcome.OUTPUT_LIMIT, f"printed more than {config.max_output_bytes} bytes; killed"
    if timed_out:
        return Outcome.TIMEOUT, f"still running after {config.wall_s:g} s (wall clock); killed"
    status = _as_status(exit_code)
    if status == 0:
        return Outcome.OK, "exited normally"
    signum = status - 128 if status > 128 else None
    if signum == signal.SIGXCPU:
        return Outcome.TIMEOUT, f"used more than {config.cpu_s} s of CPU time; killed"
    if signum == signal.SIGXFSZ or "[Errno 27] File too large" in stderr:
        return Outcome.OUTPUT_LIMIT, f"wrote a file larger than {config.max_file_bytes} bytes"
    if "MemoryError" in stderr:
        return Outcome.MEMORY, f"ran out of memory (limit {config.memory_mb} MiB per process)"
    if signum == signal.SIGKILL:
        return Outcome.CRASH, "killed by SIGKILL (the CPU hard limit, or the kernel out of memory)"
    if signum is not None and signum in signal.valid_signals():
        return Outcome.CRASH, f"killed by {signal.Signals(signum).name}"
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else "no error message"
    return Outcome.CRASH, f"exited with status {status}: {last_line[:300]}"

