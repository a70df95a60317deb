"""Kill -9 at every step of an overwrite or delete: the old or the new checkpoint is always loadable afterwards,
and the next open of the store cleans the killed save's leftovers without touching a live process's save.

A forked child runs one store operation with the store's filesystem calls (mkdir, rename, replace, directory
exchange, unlink, rmdir, rmtree) wrapped: at the k-th call it SIGKILLs itself (no finally block runs), or pauses
until the parent lets it go on. k runs from 1 until the operation completes, so every crash point is tried.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

from tinker_cookbook.engine.store import crash_safety as store_staging
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.tinker import errors, types

LORA = types.LoraConfig(rank=8)
OLD = {"adapter_model.safetensors": b"old" * 100, "only_old.json": b"{}"}
NEW = {"adapter_model.safetensors": b"new" * 100, "only_new.json": b"[]"}
MAX_STEPS = 200  # far more filesystem calls than one small save makes; reaching it means a runaway loop


def _writer(files: dict[str, bytes]) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        for rel, content in files.items():
            (directory / rel).write_bytes(content)

    return write


def _step_functions() -> Iterator[tuple[object, str]]:
    """(module, attribute) of every call that changes the filesystem during a save, delete or cleanup."""
    for name in ("mkdir", "rename", "replace", "unlink", "rmdir"):
        yield os, name
    yield shutil, "rmtree"
    yield store_staging, "exchange"


def _in_child(
    operation: Callable[[], object], step: int, mode: Literal["kill", "pause"]
) -> tuple[int, int, int]:
    """Fork; the child runs ``operation`` and stops at filesystem call number ``step``.

    Returns (pid, read fd that gets a byte when the child pauses or finishes, write fd that resumes it).
    """
    paused_r, paused_w = os.pipe()
    resume_r, resume_w = os.pipe()
    pid = os.fork()
    if pid != 0:
        os.close(paused_w)
        os.close(resume_r)
        return pid, paused_r, resume_w
    code = 1
    try:
        calls = 0
        for module, name in _step_functions():
            original = getattr(module, name)

            def wrapped(*args: object, _original: Callable[..., object] = original, **kwargs: object) -> object:
                nonlocal calls
                calls += 1
                if calls == step:
                    if mode == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    os.write(paused_w, b"p")
                    os.read(resume_r, 1)
                return _original(*args, **kwargs)

            setattr(module, name, wrapped)
        operation()
        os.write(paused_w, b"d")
        code = 0
    except BaseException:  # noqa: BLE001 - any failure, reported here since the child never returns
        traceback.print_exc()
    finally:
        os._exit(code)


def _run_killed_at(operation: Callable[[], object], step: int) -> bool:
    """Run ``operation`` in a child killed at filesystem call ``step``; True if it was killed (False: it finished)."""
    pid, paused_r, resume_w = _in_child(operation, step, "kill")
    _, status = os.waitpid(pid, 0)
    os.close(paused_r)
    os.close(resume_w)
    if os.WIFEXITED(status):
        assert os.WEXITSTATUS(status) == 0, "the operation failed in the child"
        return False
    assert os.WTERMSIG(status) == signal.SIGKILL
    return True


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.name != "checkpoint.json"}


def _staging_entries(store: CheckpointStore, run_id: str) -> list[str]:
    staging = store.runs_dir / run_id / ".staging"
    return sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []


@pytest.fixture(params=["exchange", "two_renames"])
def swap(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Overwrite with an atomic directory exchange where the filesystem has one, else with the fallback."""
    if request.param == "exchange":
        a, b = tmp_path / "probe_a", tmp_path / "probe_b"
        a.mkdir()
        b.mkdir()
        if not store_staging.exchange(a, b):
            pytest.skip("this filesystem has no atomic directory exchange")
    else:
        monkeypatch.setattr(store_staging, "exchange", lambda a, b: False)  # as on a system without renameat2
    return str(request.param)


def _crash_every_step(
    root: Path, operation: Callable[[CheckpointStore], object], check: Callable[[CheckpointStore, int], None]
) -> int:
    """Kill ``operation`` at each step in turn, then reopen the store and ``check`` it; returns the step count."""
    for step in range(1, MAX_STEPS):
        store = CheckpointStore(root)
        killed = _run_killed_at(functools.partial(operation, store), step)
        check(CheckpointStore(root), step)  # a fresh open, as after a restart
        if not killed:
            return step
    raise AssertionError(f"the operation did not finish within {MAX_STEPS} filesystem calls")


def test_overwrite_killed_at_every_step(tmp_path: Path, swap: str) -> None:
    root = tmp_path / "home"
    store = CheckpointStore(root)
    run_id = store.create_run("m", LORA, run_id="R")
    path = f"tinker://{run_id}/weights/x"
    outcomes: list[str] = []

    def overwrite(s: CheckpointStore) -> object:
        return s.write_checkpoint(run_id, "weights", "x", _writer(NEW), {"v": "new"}, overwrite=True)

    def check(s: CheckpointStore, step: int) -> None:
        files = _files(s.checkpoint_dir(path))
        version = s.checkpoint_metadata(path)["v"]
        assert files == (OLD if version == "old" else NEW), f"step {step}: files and checkpoint.json disagree"
        assert [c.tinker_path for c in s.list_checkpoints(run_id).checkpoints] == [path]
        assert _staging_entries(s, run_id) == [], f"step {step}: leftovers not cleaned on open"
        assert sorted(p.name for p in (s.runs_dir / run_id / "weights").iterdir()) == ["x"]
        outcomes.append(version)
        # Put the old checkpoint back for the next step.
        s.write_checkpoint(run_id, "weights", "x", _writer(OLD), {"v": "old"}, overwrite=True)

    store.write_checkpoint(run_id, "weights", "x", _writer(OLD), {"v": "old"})
    steps = _crash_every_step(root, overwrite, check)
    assert steps > 3 and outcomes[0] == "old" and outcomes[-1] == "new"


def test_delete_killed_at_every_step(tmp_path: Path) -> None:
    root = tmp_path / "home"
    store = CheckpointStore(root)
    run_id = store.create_run("m", LORA, run_id="R")
    path = f"tinker://{run_id}/weights/x"

    def check(s: CheckpointStore, step: int) -> None:
        listed = [c.tinker_path for c in s.list_checkpoints(run_id).checkpoints]
        if listed:  # killed before the checkpoint went away: it is whole
            assert listed == [path] and _files(s.checkpoint_dir(path)) == OLD
        else:
            with pytest.raises(errors.NotFoundError):
                s.checkpoint_dir(path)
        assert _staging_entries(s, run_id) == [], f"step {step}: leftovers not cleaned on open"
        if not listed:
            s.write_checkpoint(run_id, "weights", "x", _writer(OLD), {})

    store.write_checkpoint(run_id, "weights", "x", _writer(OLD), {})
    s = CheckpointStore(root)
    s.archive(path)
    assert _crash_every_step(root, lambda st: st.delete_checkpoint(path), check) > 2


def test_first_save_killed_at_every_step(tmp_path: Path) -> None:
    root = tmp_path / "home"
    run_id = CheckpointStore(root).create_run("m", LORA, run_id="R")
    path = f"tinker://{run_id}/sampler_weights/s"

    def check(s: CheckpointStore, step: int) -> None:
        listed = [c.tinker_path for c in s.list_checkpoints(run_id).checkpoints]
        if listed:
            assert _files(s.checkpoint_dir(path)) == NEW
            s.delete_checkpoint(path)
        assert _staging_entries(s, run_id) == [], f"step {step}: leftovers not cleaned on open"

    def save(s: CheckpointStore) -> object:
        return s.write_checkpoint(run_id, "sampler_weights", "s", _writer(NEW), {})

    assert _crash_every_step(root, save, check) > 2


def test_live_save_is_not_cleaned(tmp_path: Path, swap: str) -> None:
    """Opening the store while another process is paused at each step of its overwrite leaves its save alone."""
    root = tmp_path / "home"
    store = CheckpointStore(root)
    run_id = store.create_run("m", LORA, run_id="R")
    path = f"tinker://{run_id}/weights/x"
    store.write_checkpoint(run_id, "weights", "x", _writer(OLD), {"v": "old"})
    for step in range(1, MAX_STEPS):
        store = CheckpointStore(root)

        def overwrite(store: CheckpointStore = store) -> object:
            return store.write_checkpoint(run_id, "weights", "x", _writer(NEW), {"v": "new"}, overwrite=True)

        pid, paused_r, resume_w = _in_child(overwrite, step, "pause")
        try:
            state = os.read(paused_r, 1)
            if state == b"p":
                before = _staging_entries(store, run_id)
                CheckpointStore(root)  # another process opens the store meanwhile
                after = _staging_entries(store, run_id)
                os.write(resume_w, b"r")
                assert after == before, f"step {step}: a live save was cleaned"
        except BaseException:
            os.kill(pid, signal.SIGKILL)  # never leave the child paused
            raise
        finally:
            _, status = os.waitpid(pid, 0)
            os.close(paused_r)
            os.close(resume_w)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"step {step}: the paused save failed"
        assert _files(store.checkpoint_dir(path)) == NEW and store.checkpoint_metadata(path) == {"v": "new"}
        assert _staging_entries(store, run_id) == []
        if state == b"d":
            return
        store.write_checkpoint(run_id, "weights", "x", _writer(OLD), {"v": "old"}, overwrite=True)
    raise AssertionError("the overwrite did not finish")


def test_writes_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file of a checkpoint and every directory a rename changed is fsynced before the save returns."""
    store = CheckpointStore(tmp_path / "home")
    run_id = store.create_run("m", LORA, run_id="R")
    synced: list[str] = []
    original = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        original(fd)

    monkeypatch.setattr(os, "fsync", spy)
    store.write_checkpoint(run_id, "weights", "x", _writer(OLD), {})
    synced_after_first = set(synced)
    store.write_checkpoint(run_id, "weights", "x", _writer(NEW), {}, overwrite=True)
    run_dir = (store.runs_dir / run_id).resolve()
    # A file is fsynced in staging (its name there is the save's own); check by the final names.
    names = {Path(p).name for p in synced_after_first}
    assert {"adapter_model.safetensors", "only_old.json"} <= names
    assert str(run_dir / "weights") in synced_after_first  # the rename into place is durable
    assert str(run_dir / ".staging") in synced_after_first
    assert {"adapter_model.safetensors", "only_new.json"} <= {Path(p).name for p in synced}


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_staleness_by_owner_and_name_time(tmp_path: Path) -> None:
    """Open removes entries of dead processes and day-old names (a reused pid), restores a dead backup, and keeps
    a live process's entries even when their directory is old (a backup keeps its checkpoint's mtime)."""
    root = tmp_path / "home"
    store = CheckpointStore(root)
    run_id = store.create_run("m", LORA, run_id="R")
    store.write_checkpoint(run_id, "weights", "live", _writer(OLD), {})
    staging = store.runs_dir / run_id / ".staging"
    now, day_ago = int(time.time()), int(time.time()) - store_staging.STALE_SECONDS - 60
    me, dead = os.getpid(), _dead_pid()

    def entry(role: str, pid: int, created: int, *target: str) -> Path:
        path = staging / "+".join((role, str(pid), str(created), "ab", *target))
        path.mkdir()
        (path / "checkpoint.json").write_text('{"time": "2026-01-01T00:00:00+00:00"}')
        os.utime(path, (1_000_000_000, 1_000_000_000))  # the directory itself looks ancient
        return path

    kept = [entry("new", me, now, "weights", "a"), entry("old", me, now, "weights", "b")]
    removed = [
        entry("new", dead, now, "weights", "c"),
        entry("trash", me, day_ago),
        entry("old", me, day_ago, "weights", "live"),
    ]
    restored = entry("old", dead, now, "weights", "d")
    CheckpointStore(root)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in removed) and not restored.exists()
    assert not (store.runs_dir / run_id / "weights" / "b").exists()  # a live overwrite's backup stays put
    assert store.checkpoint_dir(f"tinker://{run_id}/weights/d").is_dir()
    assert _files(store.checkpoint_dir(f"tinker://{run_id}/weights/live")) == OLD  # a live checkpoint wins
