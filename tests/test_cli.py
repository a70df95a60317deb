"""The ``tinker-cookbook`` CLI, run in-process through ``main([...])`` against a store in tmp_path."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tinker_cookbook import cli
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.tinker import types


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    monkeypatch.setenv("TINKER_COOKBOOK_HOME", str(tmp_path / "home"))
    return CheckpointStore()


@pytest.fixture
def run_id(store: CheckpointStore) -> str:
    return store.create_run("tiny-model", types.LoraConfig(rank=16), user_metadata={"who": "test"})


def _save(store: CheckpointStore, run_id: str, kind: str, name: str, size: int = 1500) -> str:
    def write(directory: Path) -> None:
        (directory / "adapter_model.safetensors").write_bytes(b"\x00" * size)
        (directory / "adapter_config.json").write_text('{"r": 16}')

    return store.write_checkpoint(run_id, kind, name, write, {}).tinker_path  # type: ignore[arg-type]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_format_helpers() -> None:
    assert cli.format_size(None) == "-"
    assert cli.format_size(999) == "999 B"
    assert cli.format_size(342_400_000) == "342.4 MB"
    assert cli.format_size(2_500_000_000_000) == "2500.0 GB"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert cli.format_relative(now - timedelta(minutes=23, seconds=5), now) == "23 minutes ago"
    assert cli.format_relative(now - timedelta(seconds=1), now) == "1 second ago"
    assert cli.format_relative(now + timedelta(hours=2, minutes=1), now) == "in 2 hours"
    assert cli.format_relative(None, now, never="never") == "never"


def test_checkpoint_list_table_and_json(
    store: CheckpointStore, run_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _save(store, run_id, "weights", "0001")
    second = _save(store, run_id, "sampler_weights", "final")
    code, out, _ = _run(capsys, "checkpoint", "list")
    assert code == 0
    for text in ("Checkpoint ID", "weights/0001", "sampler_weights/final", first, second, "1.5 KB", "never"):
        assert text in out
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "list", "--run-id", run_id, "--limit", "1")
    data = json.loads(out)
    assert code == 0 and [c["tinker_path"] for c in data["checkpoints"]] == [second]  # newest first
    assert data["cursor"]["total_count"] == 2
    _, out, _ = _run(capsys, "--format", "json", "checkpoint", "list", "--limit", "0")
    assert len(json.loads(out)["checkpoints"]) == 2
    # -f / --format is also accepted after the subcommand, and a later one wins over an earlier one.
    for argv in (["checkpoint", "list", "-f", "json"], ["checkpoint", "list", "--format", "json"],
                 ["-f", "table", "checkpoint", "list", "--format=json"]):
        code, out, _ = _run(capsys, *argv)
        assert code == 0 and len(json.loads(out)["checkpoints"]) == 2
    code, out, _ = _run(capsys, "-f", "json", "run", "list")
    assert code == 0 and json.loads(out)["training_runs"]


def test_checkpoint_info(store: CheckpointStore, run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _save(store, run_id, "weights", "0001")
    code, out, _ = _run(capsys, "checkpoint", "info", path)
    assert code == 0
    for text in (
        "Checkpoint: weights/0001",
        "training",
        path,
        "Training Run ID",
        run_id,
        "tiny-model",
        "16",
        "No",
    ):
        assert text in out
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "info", path)
    data = json.loads(out)
    assert (data["checkpoint_id"], data["training_run_id"], data["lora_rank"], data["public"]) == (
        "weights/0001",
        run_id,
        16,
        False,
    )


def test_publish_unpublish(store: CheckpointStore, run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _save(store, run_id, "sampler_weights", "p")
    code, out, _ = _run(capsys, "checkpoint", "publish", path)
    assert code == 0 and "Published" in out and store.get_checkpoint(path).public
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "unpublish", path)
    assert code == 0 and json.loads(out) == {"tinker_path": path, "public": False}
    assert not store.get_checkpoint(path).public


def test_set_ttl(store: CheckpointStore, run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _save(store, run_id, "weights", "t")
    code, out, _ = _run(capsys, "checkpoint", "set-ttl", path, "--ttl", "7200")
    assert code == 0 and "expires in 1 hour" in out  # a moment has passed since "now + 2 h"
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "set-ttl", path, "--remove")
    assert code == 0 and json.loads(out)["expires_at"] is None
    code, _, err = _run(capsys, "checkpoint", "set-ttl", path)
    assert code == 1 and "--ttl" in err


def test_download(
    store: CheckpointStore, run_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _save(store, run_id, "sampler_weights", "final", size=10)
    out_dir = tmp_path / "downloads"
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "download", path, "-o", str(out_dir))
    target = out_dir / f"{run_id}_sampler_weights_final"
    assert code == 0 and json.loads(out) == {
        "tinker_path": path,
        "path": str(target),
        "files": ["adapter_config.json", "adapter_model.safetensors"],
    }
    assert (target / "adapter_model.safetensors").read_bytes() == b"\x00" * 10
    assert sorted(p.name for p in out_dir.iterdir()) == [target.name]  # no staging leftovers
    code, _, err = _run(capsys, "checkpoint", "download", path, "-o", str(out_dir))
    assert code == 1 and "--force" in err and err.count("\n") == 1
    (target / "stale").write_text("old")
    code, _, _ = _run(capsys, "checkpoint", "download", path, "-o", str(out_dir), "--force")
    assert code == 0 and not (target / "stale").exists()


def test_delete(
    store: CheckpointStore, run_id: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _save(store, run_id, "weights", "a")
    b = _save(store, run_id, "weights", "b")
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    code, _, err = _run(capsys, "checkpoint", "delete", a)
    assert code == 1 and "nothing deleted" in err and store.get_checkpoint(a)
    # One bad path: nothing is deleted, not even the good ones before it.
    code, _, err = _run(capsys, "checkpoint", "delete", a, f"tinker://{run_id}/weights/missing", "-y")
    assert code == 1 and "missing" in err and store.get_checkpoint(a)
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    code, out, _ = _run(capsys, "checkpoint", "delete", a)
    assert code == 0 and f"Deleted {a}" in out
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "delete", b, "-y")
    assert code == 0 and json.loads(out) == {"deleted": [b]}
    assert store.list_checkpoints(run_id).checkpoints == []


def test_run_list_and_info(store: CheckpointStore, run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _save(store, run_id, "sampler_weights", "s")
    code, out, _ = _run(capsys, "run", "list")
    assert code == 0
    for text in ("Training runs (1 of 1)", run_id, "tiny-model", "rank 16", "ok"):
        assert text in out
    code, out, _ = _run(capsys, "--format", "json", "run", "list", "--limit", "0")
    assert [r["training_run_id"] for r in json.loads(out)["training_runs"]] == [run_id]
    code, out, _ = _run(capsys, "run", "info", run_id)
    assert code == 0 and path in out and '"who": "test"' in out
    code, out, _ = _run(capsys, "--format", "json", "run", "info", run_id)
    data = json.loads(out)
    assert data["last_sampler_checkpoint"]["tinker_path"] == path and data["user_metadata"] == {"who": "test"}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["checkpoint", "info", "s3://bucket/weights/x"], "not a tinker:// path"),
        (["checkpoint", "info", "tinker://run/weights/../x"], "malformed checkpoint path"),
        (["checkpoint", "info", "tinker://nope/weights/x"], "training run 'nope' not found"),
        (["checkpoint", "publish", "tinker://nope/weights/x"], "not found"),
        (["checkpoint", "download", "file:///etc/passwd"], "not a tinker:// path"),
        (["checkpoint", "list", "--run-id", "nope"], "nope"),
        (["run", "info", "nope"], "run list"),
    ],
)
def test_errors_are_one_line_exit_1(
    store: CheckpointStore, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith("Error: ") and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_usage_errors_exit_2(store: CheckpointStore, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["checkpoint"], ["run", "list", "--limit", "-1"], ["--format", "yaml", "run", "list"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2
    capsys.readouterr()


def test_empty_store(store: CheckpointStore, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--format", "json", "checkpoint", "list")
    assert code == 0 and json.loads(out)["checkpoints"] == []
    code, out, _ = _run(capsys, "run", "list")
    assert code == 0 and "(0 of 0)" in out
