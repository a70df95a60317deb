"""The checkpoint store never follows a symlink planted inside it.

Each test plants one kind of symlink pointing to a directory outside the store that holds a canary, then checks
that reads refuse with an error naming the entry, deletes leave the canary, and listings skip the entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.engine.store.paths import UnsafeStoreEntryError
from tinker_cookbook.tinker import errors, types

LORA = types.LoraConfig(rank=8)
CANARY = b"outside the store: must survive"


def _writer(files: dict[str, bytes]) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        for rel, content in files.items():
            (directory / rel).write_bytes(content)

    return write


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "home")


@pytest.fixture
def run_id(store: CheckpointStore) -> str:
    return store.create_run("tiny-model", LORA, run_id="R")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the store that looks like a checkpoint (and a run) and holds a canary."""
    directory = tmp_path / "outside"
    ckpt = directory / "x"
    ckpt.mkdir(parents=True)
    (ckpt / "canary").write_bytes(CANARY)
    record = {"checkpoint_type": "training", "time": "2026-01-01T00:00:00+00:00", "metadata": {}}
    (ckpt / "checkpoint.json").write_text(json.dumps(record))
    (directory / "canary").write_bytes(CANARY)
    return directory


def _outside_untouched(outside: Path) -> None:
    assert (outside / "canary").read_bytes() == CANARY
    assert (outside / "x" / "canary").read_bytes() == CANARY
    assert sorted(p.name for p in outside.iterdir()) == ["canary", "x"]  # nothing written out there either


def _refuses(entry: str, call: Callable[[], object]) -> None:
    with pytest.raises(UnsafeStoreEntryError) as info:
        call()
    message = str(info.value)
    assert repr(entry) in message and "symlink" in message and "remove it" in message
    assert isinstance(info.value, errors.RequestFailedError)  # the store's state, not the request, is at fault


def test_symlinked_kind_dir(store: CheckpointStore, run_id: str, outside: Path) -> None:
    store.write_checkpoint(run_id, "sampler_weights", "s", _writer({"f": b"1"}), {})
    (store.runs_dir / run_id / "weights").symlink_to(outside)
    path = f"tinker://{run_id}/weights/x"
    _refuses("runs/R/weights", lambda: store.checkpoint_dir(path))
    _refuses("runs/R/weights", lambda: store.checkpoint_metadata(path))
    _refuses("runs/R/weights", lambda: store.delete_checkpoint(path))
    _refuses("runs/R/weights", lambda: store.set_public(path, True))
    _refuses("runs/R/weights", lambda: store.archive(path))
    _refuses("runs/R/weights", lambda: store.write_checkpoint(run_id, "weights", "y", _writer({"f": b"2"}), {}))
    _refuses("runs/R/weights", lambda: store.write_checkpoint(run_id, "weights", "x", _writer({}), {}, overwrite=True))
    listed = [c.tinker_path for c in store.list_checkpoints(run_id).checkpoints]
    assert listed == [f"tinker://{run_id}/sampler_weights/s"]  # the symlinked kind is skipped, the rest listed
    assert [c.tinker_path for c in store.list_user_checkpoints().checkpoints] == listed
    assert store.get_run(run_id).last_checkpoint is None
    _outside_untouched(outside)


def test_symlinked_checkpoint_dir(store: CheckpointStore, run_id: str, outside: Path) -> None:
    (store.runs_dir / run_id / "weights").mkdir()
    (store.runs_dir / run_id / "weights" / "x").symlink_to(outside / "x")
    path = f"tinker://{run_id}/weights/x"
    _refuses("runs/R/weights/x", lambda: store.checkpoint_dir(path))
    _refuses("runs/R/weights/x", lambda: store.delete_checkpoint(path))
    _refuses("runs/R/weights/x", lambda: store.write_checkpoint(run_id, "weights", "x", _writer({}), {}, overwrite=True))
    assert store.list_checkpoints(run_id).checkpoints == []
    _outside_untouched(outside)


@pytest.mark.parametrize("inner", ["adapter_model.safetensors", "checkpoint.json"])
def test_symlinked_file_in_checkpoint(store: CheckpointStore, run_id: str, outside: Path, inner: str) -> None:
    files = {"adapter_model.safetensors": b"w", "adapter_config.json": b"{}"}
    path = store.write_checkpoint(run_id, "sampler_weights", "c", _writer(files), {}).tinker_path
    planted = store.runs_dir / run_id / "sampler_weights" / "c" / inner
    target = outside / "x" / inner if inner == "checkpoint.json" else outside / "canary"
    planted.unlink()
    planted.symlink_to(target)
    entry = f"runs/R/sampler_weights/c/{inner}"
    _refuses(entry, lambda: store.checkpoint_dir(path))
    _refuses(entry, lambda: store.archive(path))
    _refuses(entry, lambda: store.delete_checkpoint(path))
    _refuses(entry, lambda: store.set_ttl(path, 60))
    _refuses(entry, lambda: store.write_checkpoint(run_id, "sampler_weights", "c", _writer({}), {}, overwrite=True))
    assert store.list_checkpoints(run_id).checkpoints == []
    _outside_untouched(outside)


def test_symlinked_nested_file_in_checkpoint(store: CheckpointStore, run_id: str, outside: Path) -> None:
    def write(directory: Path) -> None:
        (directory / "sub").mkdir()
        (directory / "sub" / "state.safetensors").write_bytes(b"s")

    path = store.write_checkpoint(run_id, "weights", "n", write, {}).tinker_path
    planted = store.runs_dir / run_id / "weights" / "n" / "sub" / "state.safetensors"
    planted.unlink()
    planted.symlink_to(outside / "canary")
    _refuses("runs/R/weights/n/sub/state.safetensors", lambda: store.checkpoint_dir(path))
    _refuses("runs/R/weights/n/sub/state.safetensors", lambda: store.archive(path))
    _outside_untouched(outside)


def test_symlinked_run_json(store: CheckpointStore, run_id: str, outside: Path) -> None:
    other = store.create_run("m", LORA, run_id="other")
    fake_run = outside / "x" / "checkpoint.json"  # any JSON file outside will do
    (store.runs_dir / run_id / "run.json").unlink()
    (store.runs_dir / run_id / "run.json").symlink_to(fake_run)
    before = fake_run.read_bytes()
    _refuses("runs/R/run.json", lambda: store.get_run(run_id))
    _refuses("runs/R/run.json", lambda: store.run_record(run_id))
    _refuses("runs/R/run.json", lambda: store.touch_run(run_id))
    _refuses("runs/R/run.json", lambda: store.write_checkpoint(run_id, "weights", "y", _writer({}), {}))
    assert [r.training_run_id for r in store.list_runs().training_runs] == [other]
    assert fake_run.read_bytes() == before
    _outside_untouched(outside)


def test_symlinked_run_dir(store: CheckpointStore, run_id: str, outside: Path) -> None:
    (outside / "run.json").write_text(json.dumps({"base_model": "m", "created_time": "2026-01-01T00:00:00+00:00"}))
    (outside / "weights").mkdir()
    (outside / "x").rename(outside / "weights" / "x")
    (store.runs_dir / "evil").symlink_to(outside)
    path = "tinker://evil/weights/x"
    _refuses("runs/evil", lambda: store.checkpoint_dir(path))
    _refuses("runs/evil", lambda: store.delete_checkpoint(path))
    _refuses("runs/evil", lambda: store.get_run("evil"))
    assert [r.training_run_id for r in store.list_runs().training_runs] == [run_id]
    assert store.list_user_checkpoints().checkpoints == []
    assert (outside / "weights" / "x" / "canary").read_bytes() == CANARY


def test_symlinked_runs_dir(tmp_path: Path, outside: Path) -> None:
    (outside / "R" / "weights").mkdir(parents=True)
    (outside / "R" / "run.json").write_text(json.dumps({"base_model": "m"}))
    (outside / "x").rename(outside / "R" / "weights" / "x")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "runs").symlink_to(outside)
    store = CheckpointStore(tmp_path / "home")  # opening (and its cleanup) must not follow the link
    _refuses("runs", lambda: store.checkpoint_dir("tinker://R/weights/x"))
    _refuses("runs", lambda: store.delete_checkpoint("tinker://R/weights/x"))
    _refuses("runs", lambda: store.list_runs())
    _refuses("runs", lambda: store.list_user_checkpoints())
    _refuses("runs", lambda: store.create_run("m", LORA))
    assert (outside / "R" / "weights" / "x" / "canary").read_bytes() == CANARY
    assert sorted(p.name for p in outside.iterdir()) == ["R", "canary"]


def test_symlinked_staging(store: CheckpointStore, run_id: str, outside: Path) -> None:
    path = store.write_checkpoint(run_id, "weights", "k", _writer({"f": b"1"}), {}).tinker_path
    staging = store.runs_dir / run_id / ".staging"
    for entry in staging.iterdir():
        entry.unlink()
    staging.rmdir()
    staging.symlink_to(outside)
    _refuses("runs/R/.staging", lambda: store.write_checkpoint(run_id, "weights", "y", _writer({"f": b"2"}), {}))
    _refuses("runs/R/.staging", lambda: store.delete_checkpoint(path))
    _refuses("runs/R/.staging", lambda: store.touch_run(run_id))
    _refuses("runs/R/.staging", lambda: store.set_public(path, True))
    CheckpointStore(store.root)  # opening cleans staging of every run: never through the link
    assert store.checkpoint_dir(path).joinpath("f").read_bytes() == b"1"  # reads do not need staging
    _outside_untouched(outside)


def test_symlink_entries_inside_staging_are_unlinked_not_followed(
    store: CheckpointStore, run_id: str, outside: Path
) -> None:
    staging = store.runs_dir / run_id / ".staging"
    staging.mkdir(exist_ok=True)
    # Names of a dead process's save, backup and trash: the cleanup on open would delete or restore them.
    for role in ("new", "old", "trash"):
        (staging / f"{role}+999999999+1700000000+ab+weights+x").symlink_to(outside / "x")
    (staging / "tmp+999999999+1700000000+ab+run.json").symlink_to(outside / "canary")
    CheckpointStore(store.root)
    assert list(staging.iterdir()) == []
    assert not (store.runs_dir / run_id / "weights" / "x").exists()  # a symlinked backup is never restored
    _outside_untouched(outside)


def test_symlinked_archives(store: CheckpointStore, run_id: str, outside: Path) -> None:
    path = store.write_checkpoint(run_id, "weights", "x", _writer({"f": b"1"}), {}).tinker_path
    (outside / "weights").mkdir()
    (outside / "x").rename(outside / "weights" / "x")  # what the cache path .archives/weights/x would reach
    (store.runs_dir / run_id / ".archives").symlink_to(outside)
    _refuses("runs/R/.archives", lambda: store.archive(path))
    _refuses("runs/R/.archives", lambda: store.delete_checkpoint(path))
    _refuses("runs/R/.archives", lambda: store.write_checkpoint(run_id, "weights", "x", _writer({}), {}, overwrite=True))
    assert store.checkpoint_dir(path).joinpath("f").read_bytes() == b"1"  # refused before anything changed
    assert (outside / "weights" / "x" / "canary").read_bytes() == CANARY
    assert sorted(p.name for p in outside.iterdir()) == ["canary", "weights"]


def test_expiry_does_not_follow_symlinked_archives(
    store: CheckpointStore, run_id: str, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from tinker_cookbook.engine.store import records

    store.write_checkpoint(run_id, "weights", "x", _writer({"f": b"1"}), {}, ttl_seconds=1)
    (outside / "weights").mkdir()
    (outside / "x").rename(outside / "weights" / "x")
    (store.runs_dir / run_id / ".archives").symlink_to(outside)
    later = records.now() + timedelta(seconds=10)
    monkeypatch.setattr(records, "now", lambda: later)
    assert store.list_checkpoints(run_id).checkpoints == []  # expired: not listed, and the listing still works
    assert (outside / "weights" / "x" / "canary").read_bytes() == CANARY
