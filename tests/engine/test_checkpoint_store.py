"""The local checkpoint store: atomic writes, path safety, TTL, publishing, archives, listing."""

from __future__ import annotations

import json
import os
import signal
import tarfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.store import checkpoint_store as cs
from tinker_cookbook.engine.store import records
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.tinker import errors, types

LORA = types.LoraConfig(rank=8, train_unembed=False)


def _writer(files: dict[str, bytes]):
    def write(directory: Path) -> None:
        for rel, content in files.items():
            (directory / rel).parent.mkdir(parents=True, exist_ok=True)
            (directory / rel).write_bytes(content)

    return write


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "home")


@pytest.fixture
def run_id(store: CheckpointStore) -> str:
    return store.create_run("tiny-model", LORA, user_metadata={"task": "pig-latin"})


def _visible_entries(store: CheckpointStore, run_id: str) -> list[str]:
    """Everything a listing could pick up: the non-hidden entries of weights/ and sampler_weights/."""
    run_dir = store.runs_dir / run_id
    return sorted(
        f"{kind}/{p.name}"
        for kind in cs.KINDS
        if (run_dir / kind).is_dir()
        for p in (run_dir / kind).iterdir()
    )


def test_root_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.HOME_ENV, str(tmp_path / "elsewhere"))
    assert CheckpointStore().root == tmp_path / "elsewhere"
    monkeypatch.delenv(settings.HOME_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))  # opening a store cleans it up: never touch the real home
    assert CheckpointStore().root == tmp_path / ".tinker_cookbook"


def test_create_and_get_run(store: CheckpointStore, run_id: str) -> None:
    assert run_id.startswith("run-") and len(run_id.split("-")) == 4
    run = store.get_run(run_id)
    assert (run.training_run_id, run.base_model, run.lora_rank, run.is_lora) == (
        run_id,
        "tiny-model",
        8,
        True,
    )
    assert run.user_metadata == {"task": "pig-latin"}
    assert run.last_checkpoint is None and run.last_sampler_checkpoint is None
    record = json.loads((store.runs_dir / run_id / "run.json").read_text())
    assert (record["train_unembed"], record["train_mlp"], record["train_attn"]) == (False, True, True)


def test_explicit_run_id_conflict(store: CheckpointStore) -> None:
    assert store.create_run("m", LORA, run_id="my-run") == "my-run"
    with pytest.raises(errors.ConflictError, match="my-run"):
        store.create_run("m", LORA, run_id="my-run")
    with pytest.raises(errors.BadRequestError, match="run_id"):
        store.create_run("m", LORA, run_id="../escape")


def test_write_and_read_checkpoint(store: CheckpointStore, run_id: str) -> None:
    ckpt = store.write_checkpoint(
        run_id, "weights", "0001", _writer({"a.safetensors": b"x" * 10}), {"step": 1}
    )
    assert ckpt.tinker_path == f"tinker://{run_id}/weights/0001"
    assert (ckpt.checkpoint_id, ckpt.checkpoint_type, ckpt.size_bytes, ckpt.public) == (
        "weights/0001",
        "training",
        10,
        False,
    )
    directory = store.checkpoint_dir(ckpt.tinker_path)
    assert (directory / "a.safetensors").read_bytes() == b"x" * 10
    assert store.checkpoint_metadata(ckpt.tinker_path) == {"step": 1}
    sampler = store.write_checkpoint(run_id, "sampler_weights", "0001", _writer({"b": b"yy"}), {})
    assert sampler.checkpoint_type == "sampler"
    run = store.get_run(run_id)
    assert run.last_checkpoint == ckpt and run.last_sampler_checkpoint == sampler


def test_writer_failure_leaves_nothing(store: CheckpointStore, run_id: str) -> None:
    def broken(directory: Path) -> None:
        (directory / "adapter_model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError, match="killed mid-save"):
        store.write_checkpoint(run_id, "weights", "0001", broken, {})
    assert _visible_entries(store, run_id) == []
    assert store.list_checkpoints(run_id).checkpoints == []
    assert list((store.runs_dir / run_id / ".staging").iterdir()) == []
    with pytest.raises(errors.NotFoundError):
        store.checkpoint_dir(f"tinker://{run_id}/weights/0001")
    # The same name is free for the next, successful save.
    ckpt = store.write_checkpoint(run_id, "weights", "0001", _writer({"ok": b"1"}), {})
    assert store.checkpoint_dir(ckpt.tinker_path).joinpath("ok").read_bytes() == b"1"


def test_dir_without_checkpoint_json_is_invisible(store: CheckpointStore, run_id: str) -> None:
    # What a save killed between mkdir and checkpoint.json would look like if it were written in place.
    half = store.runs_dir / run_id / "weights" / "half"
    half.mkdir(parents=True)
    (half / "adapter_model.safetensors").write_bytes(b"partial")
    assert store.list_checkpoints(run_id).checkpoints == []
    with pytest.raises(errors.NotFoundError, match="half"):
        store.checkpoint_dir(f"tinker://{run_id}/weights/half")
    # Writing that name replaces the debris without needing overwrite=True.
    store.write_checkpoint(run_id, "weights", "half", _writer({"new": b"n"}), {})
    assert sorted(p.name for p in half.iterdir()) == ["checkpoint.json", "new"]


def test_conflict_and_overwrite(store: CheckpointStore, run_id: str) -> None:
    store.write_checkpoint(run_id, "weights", "x", _writer({"old": b"old", "only_old": b"1"}), {"v": 1})
    calls = []
    with pytest.raises(errors.ConflictError, match="overwrite=True"):
        store.write_checkpoint(run_id, "weights", "x", lambda d: calls.append(d), {"v": 2})
    assert calls == []  # the conflict is found before the engine spends time writing
    path = f"tinker://{run_id}/weights/x"
    store.write_checkpoint(run_id, "weights", "x", _writer({"new": b"new"}), {"v": 2}, overwrite=True)
    assert sorted(p.name for p in store.checkpoint_dir(path).iterdir()) == ["checkpoint.json", "new"]
    assert store.checkpoint_metadata(path) == {"v": 2}
    assert _visible_entries(store, run_id) == ["weights/x"]


def test_failed_overwrite_keeps_old(store: CheckpointStore, run_id: str) -> None:
    store.write_checkpoint(run_id, "weights", "x", _writer({"old": b"old"}), {"v": 1})

    def broken(directory: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.write_checkpoint(run_id, "weights", "x", broken, {"v": 2}, overwrite=True)
    assert store.checkpoint_metadata(f"tinker://{run_id}/weights/x") == {"v": 1}


@pytest.mark.parametrize(
    "path",
    [
        "tinker://run/weights/../../etc",
        "tinker://../weights/x",
        "tinker://run/weights/a/b",
        "tinker://run/other/x",
        "tinker://run/weights/",
        "tinker://run/weights/.hidden",
        "tinker://run/weights/x y",
        "tinker:/run/weights/x",
        "s3://bucket/run/weights/x",
        "file:///etc/passwd",
        "/abs/path/weights/x",
        "",
        "tinker://a:eval:17/weights/x",  # the hosted "<id>:train:<n>" form is accepted, nothing else after ":"
        "tinker://a:train:/weights/x",
        "tinker://run/weights/x\n",  # `$` alone would match before a final newline
        "tinker://run/weights/x\r\n",
        "tinker://run\n/weights/x",
    ],
)
def test_bad_paths_rejected(store: CheckpointStore, path: str) -> None:
    with pytest.raises(errors.BadRequestError) as info:
        store.checkpoint_dir(path)
    assert repr(path) in str(info.value) or path in str(info.value)
    assert "tinker://<run_id>" in str(info.value)


def test_non_string_path_rejected(store: CheckpointStore) -> None:
    with pytest.raises(errors.BadRequestError, match="must be a string"):
        store.checkpoint_dir(Path("weights/x"))  # type: ignore[arg-type]


def test_trailing_newline_is_not_the_same_checkpoint(store: CheckpointStore, run_id: str) -> None:
    path = store.write_checkpoint(run_id, "weights", "x", _writer({}), {}).tinker_path
    for bad in (path + "\n", path + "\r\n"):
        with pytest.raises(errors.BadRequestError, match="tinker://<run_id>"):
            store.checkpoint_dir(bad)
        with pytest.raises(ValueError):
            types.ParsedCheckpointTinkerPath.from_tinker_path(bad)


def test_bad_names_on_write(store: CheckpointStore, run_id: str) -> None:
    for name in ["", "..", "a/b", ".x", "x" * 200, "é"]:
        with pytest.raises(errors.BadRequestError, match="name"):
            store.write_checkpoint(run_id, "weights", name, _writer({}), {})
    with pytest.raises(errors.BadRequestError, match="kind"):
        store.write_checkpoint(run_id, "optimizer", "x", _writer({}), {})  # type: ignore[arg-type]
    with pytest.raises(errors.BadRequestError, match="ttl_seconds"):
        store.write_checkpoint(run_id, "weights", "x", _writer({}), {}, ttl_seconds=0)
    assert _visible_entries(store, run_id) == []


def test_unknown_ids(store: CheckpointStore, run_id: str) -> None:
    with pytest.raises(errors.NotFoundError, match=r"'nope'.*run list"):
        store.get_run("nope")
    with pytest.raises(errors.NotFoundError, match="nope"):
        store.write_checkpoint("nope", "weights", "x", _writer({}), {})
    store.write_checkpoint(run_id, "weights", "exists", _writer({}), {})
    with pytest.raises(errors.NotFoundError) as info:
        store.checkpoint_dir(f"tinker://{run_id}/weights/missing")
    assert f"tinker://{run_id}/weights/exists" in str(info.value)  # the message lists what does exist
    with pytest.raises(errors.NotFoundError):
        store.checkpoint_dir(f"tinker://{run_id}/sampler_weights/exists")


def test_unknown_run_lists_run_ids(store: CheckpointStore) -> None:
    with pytest.raises(errors.NotFoundError, match=r"'nope'.*known runs.*: none"):
        store.get_run("nope")
    ids = [store.create_run("m", LORA, run_id=f"run-{i}") for i in range(3)]
    with pytest.raises(errors.NotFoundError) as info:
        store.get_run("nope")
    message = str(info.value)
    assert "run.json" not in message
    assert all(repr(i) in message for i in ids)


def test_cli_run_info_unknown_lists_run_ids(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tinker_cookbook import cli

    monkeypatch.setenv(settings.HOME_ENV, str(store.root))
    store.create_run("m", LORA, run_id="run-a")
    assert cli.main(["run", "info", "nope"]) == 1
    err = capsys.readouterr().err
    assert "'run-a'" in err and "run.json" not in err


def test_expected_kind(store: CheckpointStore, run_id: str) -> None:
    store.write_checkpoint(run_id, "weights", "s", _writer({}), {})
    store.write_checkpoint(run_id, "sampler_weights", "s", _writer({}), {})
    assert store.checkpoint_dir(f"tinker://{run_id}/weights/s", expected_kind="weights").name == "s"
    with pytest.raises(errors.BadRequestError, match="training state.*save_weights_for_sampler"):
        store.checkpoint_dir(f"tinker://{run_id}/weights/s", expected_kind="sampler_weights")
    with pytest.raises(errors.BadRequestError, match="weights/ path from save_state"):
        store.checkpoint_dir(f"tinker://{run_id}/sampler_weights/s", expected_kind="training")


def test_ttl_expiry(store: CheckpointStore, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    monkeypatch.setattr(records, "now", lambda: start)
    ckpt = store.write_checkpoint(run_id, "weights", "t", _writer({"f": b"1"}), {}, ttl_seconds=60)
    assert ckpt.expires_at == start + timedelta(seconds=60)
    monkeypatch.setattr(records, "now", lambda: start + timedelta(seconds=59))
    assert store.checkpoint_dir(ckpt.tinker_path).is_dir()
    monkeypatch.setattr(records, "now", lambda: start + timedelta(seconds=60))
    assert store.list_checkpoints(run_id).checkpoints == []
    with pytest.raises(errors.NotFoundError, match="expired"):
        store.checkpoint_dir(ckpt.tinker_path)
    assert _visible_entries(store, run_id) == []  # removed lazily from disk
    store.write_checkpoint(run_id, "weights", "t", _writer({}), {})  # name is free again


def test_set_ttl(store: CheckpointStore, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    monkeypatch.setattr(records, "now", lambda: start)
    path = store.write_checkpoint(run_id, "weights", "t", _writer({}), {}).tinker_path
    store.set_ttl(path, 10)
    assert store.get_checkpoint(path).expires_at == start + timedelta(seconds=10)
    store.set_ttl(path, None)
    assert store.get_checkpoint(path).expires_at is None
    monkeypatch.setattr(records, "now", lambda: start + timedelta(days=1000))
    assert store.checkpoint_dir(path).is_dir()


def test_publish_unpublish(store: CheckpointStore, run_id: str) -> None:
    path = store.write_checkpoint(
        run_id, "sampler_weights", "p", _writer({"f": b"1"}), {"k": "v"}
    ).tinker_path
    store.set_public(path, True)
    assert store.get_checkpoint(path).public is True
    assert store.list_user_checkpoints().checkpoints[0].public is True
    store.set_public(path, False)
    assert store.get_checkpoint(path).public is False
    assert store.checkpoint_metadata(path) == {"k": "v"}  # flag changes keep the engine metadata
    with pytest.raises(errors.NotFoundError):
        store.set_public(f"tinker://{run_id}/sampler_weights/nope", True)


def test_delete(store: CheckpointStore, run_id: str) -> None:
    path = store.write_checkpoint(run_id, "weights", "d", _writer({"f": b"1"}), {}).tinker_path
    store.archive(path)
    store.delete_checkpoint(path)
    assert _visible_entries(store, run_id) == []
    assert not (store.runs_dir / run_id / ".archives" / "weights" / "d").exists()
    with pytest.raises(errors.NotFoundError):
        store.delete_checkpoint(path)


def test_archive_contents(store: CheckpointStore, run_id: str) -> None:
    files = {
        "adapter_model.safetensors": b"\x00" * 64,
        "adapter_config.json": b'{"r": 8}',
        "sub/extra.json": b"{}",
    }
    path = store.write_checkpoint(run_id, "sampler_weights", "final", _writer(files), {}).tinker_path
    tar_path = store.archive(path)
    with tarfile.open(tar_path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert members == {k: v for k, v in files.items()}  # no checkpoint.json, paths relative
    assert store.archive(path) == tar_path  # cached
    store.write_checkpoint(run_id, "sampler_weights", "final", _writer({"v2": b"2"}), {}, overwrite=True)
    new_tar = store.archive(path)
    with tarfile.open(new_tar) as tar:
        assert tar.getnames() == ["v2"]  # an overwrite never serves the stale archive
    assert not tar_path.exists()


def test_list_runs_order_and_pagination(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    ids = []
    for i in range(5):
        monkeypatch.setattr(records, "now", lambda i=i: base + timedelta(minutes=i))
        ids.append(store.create_run("m", LORA))
    assert ids == sorted(ids)  # ids sort by creation time
    newest_first = ids[::-1]
    page = store.list_runs(limit=2, offset=1)
    assert [r.training_run_id for r in page.training_runs] == newest_first[1:3]
    assert page.cursor == types.Cursor(offset=1, limit=2, total_count=5)
    assert [r.training_run_id for r in store.list_runs(limit=0).training_runs] == newest_first
    assert store.list_runs(offset=10).training_runs == []
    with pytest.raises(errors.BadRequestError, match="limit"):
        store.list_runs(limit=-1)
    (store.runs_dir / "incomplete").mkdir()  # a run dir without run.json is not a run
    assert store.list_runs(limit=0).cursor.total_count == 5  # type: ignore[union-attr]


def test_list_checkpoints_order_and_pagination(
    store: CheckpointStore, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    other = store.create_run("m", LORA)
    expected = []
    for i, (rid, kind) in enumerate(
        [(run_id, "weights"), (other, "sampler_weights"), (run_id, "sampler_weights")]
    ):
        monkeypatch.setattr(records, "now", lambda i=i: base + timedelta(seconds=i))
        expected.append(store.write_checkpoint(rid, kind, f"c{i}", _writer({}), {}).tinker_path)
    own = store.list_checkpoints(run_id)
    assert [c.tinker_path for c in own.checkpoints] == [expected[2], expected[0]]
    assert own.cursor == types.Cursor(offset=0, limit=2, total_count=2)
    everyone = store.list_user_checkpoints(limit=2, offset=0)
    assert [c.tinker_path for c in everyone.checkpoints] == expected[::-1][:2]
    assert everyone.cursor == types.Cursor(offset=0, limit=2, total_count=3)
    assert [c.tinker_path for c in store.list_user_checkpoints(offset=2).checkpoints] == [expected[0]]


def test_weights_info(store: CheckpointStore, run_id: str) -> None:
    path = store.write_checkpoint(run_id, "sampler_weights", "w", _writer({}), {}).tinker_path
    info = store.weights_info(path)
    assert info == types.WeightsInfoResponse(
        base_model="tiny-model",
        is_lora=True,
        lora_rank=8,
        train_unembed=False,
        train_mlp=True,
        train_attn=True,
    )


def test_touch_run(store: CheckpointStore, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    later = datetime(2030, 5, 5, tzinfo=UTC)
    monkeypatch.setattr(records, "now", lambda: later)
    store.touch_run(run_id)
    assert store.get_run(run_id).last_request_time == later


def test_stale_staging_cleaned(store: CheckpointStore, run_id: str) -> None:
    staging = store.runs_dir / run_id / ".staging"
    leftover = staging / "weights-x-dead"
    leftover.mkdir(parents=True)
    old = 1_000_000_000
    os.utime(leftover, (old, old))
    fresh = staging / "weights-y-alive"
    fresh.mkdir()
    store.write_checkpoint(run_id, "weights", "z", _writer({}), {})
    assert not leftover.exists() and fresh.exists()  # a save still in progress elsewhere is left alone


def test_symlinked_run_outside_root_not_listed(store: CheckpointStore, run_id: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "run.json").write_text(
        json.dumps({"base_model": "m", "created_time": "2026-01-01T00:00:00+00:00"})
    )
    (store.runs_dir / "evil").symlink_to(outside)
    assert [r.training_run_id for r in store.list_runs().training_runs] == [run_id]


def test_concurrent_writers_same_name(store: CheckpointStore, run_id: str) -> None:
    """Two saves of one name racing: exactly one wins, the other gets ConflictError, nothing is mixed."""
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def save(tag: str) -> None:
        def write(directory: Path) -> None:
            barrier.wait(timeout=10)  # both have passed the existence check before either moves into place
            (directory / "tag").write_text(tag)

        try:
            results[tag] = store.write_checkpoint(run_id, "weights", "race", write, {"tag": tag})
        except errors.ConflictError as e:
            results[tag] = e

    threads = [threading.Thread(target=save, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [tag for tag, r in results.items() if isinstance(r, types.Checkpoint)]
    assert len(winners) == 1 and sum(isinstance(r, errors.ConflictError) for r in results.values()) == 1
    directory = store.checkpoint_dir(f"tinker://{run_id}/weights/race")
    assert (directory / "tag").read_text() == winners[0]
    assert store.checkpoint_metadata(f"tinker://{run_id}/weights/race") == {"tag": winners[0]}


def test_killed_save_never_visible(store: CheckpointStore, run_id: str) -> None:
    """SIGKILL a process in the middle of a save: nothing lists or loads, and the next save works."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: start a save and hang inside the writer until killed
        try:
            os.close(read_end)

            def write(directory: Path) -> None:
                (directory / "adapter_model.safetensors").write_bytes(b"half")
                os.write(write_end, b"x")
                time.sleep(60)

            store.write_checkpoint(run_id, "weights", "killed", write, {})
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"x"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
    assert store.list_checkpoints(run_id).checkpoints == []
    assert _visible_entries(store, run_id) == []
    with pytest.raises(errors.NotFoundError):
        store.checkpoint_dir(f"tinker://{run_id}/weights/killed")
    store.write_checkpoint(run_id, "weights", "killed", _writer({"ok": b"1"}), {})
    assert store.checkpoint_dir(f"tinker://{run_id}/weights/killed").joinpath("ok").read_bytes() == b"1"


@pytest.mark.parametrize("content", ["{not json", "[]", '{"time": "yesterday"}', '{"metadata": {}}'])
def test_malformed_checkpoint_json_is_invisible(store: CheckpointStore, run_id: str, content: str) -> None:
    path = store.write_checkpoint(run_id, "weights", "m", _writer({"f": b"1"}), {}).tinker_path
    (store.checkpoint_dir(path) / "checkpoint.json").write_text(content)
    assert store.list_checkpoints(run_id).checkpoints == []
    assert store.get_run(run_id).last_checkpoint is None
    with pytest.raises(errors.NotFoundError):
        store.checkpoint_dir(path)
    store.write_checkpoint(run_id, "weights", "m", _writer({}), {"v": 2})  # replaceable without overwrite
    assert store.checkpoint_metadata(path) == {"v": 2}
