import asyncio

import pytest

from tinker_cookbook import checkpoint_utils, tinker
from tinker_cookbook.exceptions import CheckpointError, ConfigurationError
from tinker_cookbook.tinker import types
from tinker_cookbook.utils import ml_log


class _FakeClient:
    """Stands in for a TrainingClient: save requests complete at once (or fail)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def save_state(self, name, ttl_seconds=None):
        if self.fail:
            return tinker.APIFuture.failed(RuntimeError("disk full"))
        return tinker.APIFuture.completed(types.SaveWeightsResponse(path=f"tinker://run/weights/{name}"))

    def save_weights_for_sampler(self, name, ttl_seconds=None):
        return tinker.APIFuture.completed(
            types.SaveWeightsForSamplerResponse(path=f"tinker://run/sampler_weights/{name}")
        )


def test_row_format_and_last_checkpoint(tmp_path):
    client = _FakeClient()
    checkpoint_utils.save_checkpoint(client, "000002", tmp_path, {"step": 2, "epoch": 0, "batch": 2})
    asyncio.run(checkpoint_utils.save_checkpoint_async(client, "000004", tmp_path, {"step": 4}, kind="sampler"))
    rows = checkpoint_utils.load_checkpoints_file(tmp_path)
    assert rows[0] == {
        "name": "000002", "step": 2, "epoch": 0, "batch": 2,
        "state_path": "tinker://run/weights/000002", "sampler_path": "tinker://run/sampler_weights/000002",
    }
    assert rows[1] == {"name": "000004", "step": 4, "sampler_path": "tinker://run/sampler_weights/000004"}
    # the last row that can resume training is the first one (the second has no state)
    assert checkpoint_utils.get_last_checkpoint(tmp_path)["name"] == "000002"
    assert checkpoint_utils.get_last_checkpoint(tmp_path, "sampler_path")["name"] == "000004"


def test_a_failed_save_writes_no_row(tmp_path):
    with pytest.raises(RuntimeError, match="disk full"):
        checkpoint_utils.save_checkpoint(_FakeClient(fail=True), "000002", tmp_path, {"step": 2})
    assert checkpoint_utils.load_checkpoints_file(tmp_path) == []
    assert checkpoint_utils.get_last_checkpoint(tmp_path) is None


def test_torn_last_line_is_ignored_but_corruption_elsewhere_is_an_error(tmp_path):
    path = tmp_path / "checkpoints.jsonl"
    path.write_text('{"name": "a", "state_path": "p"}\n{"name": "b", "sta')
    assert checkpoint_utils.get_last_checkpoint(tmp_path)["name"] == "a"
    path.write_text('{"name": "a"\n{"name": "b"}\n')
    with pytest.raises(CheckpointError, match="line 1"):
        checkpoint_utils.load_checkpoints_file(tmp_path)


def test_bad_kind():
    with pytest.raises(ConfigurationError, match="kind='all'"):
        checkpoint_utils.start_checkpoint(_FakeClient(), "x", ".", {}, kind="all")  # type: ignore[arg-type]


def test_config_compatibility(tmp_path):
    (tmp_path / "config.json").write_text('{"model_name": "a", "lora_rank": 8, "learning_rate": 0.1}')
    checkpoint_utils.check_config_compatible(tmp_path, {"model_name": "a", "lora_rank": 8, "learning_rate": 1}, [
        "model_name", "lora_rank",
    ])
    with pytest.raises(ConfigurationError, match="model_name: 'a' .* 'b'"):
        checkpoint_utils.check_config_compatible(tmp_path, {"model_name": "b", "lora_rank": 8}, ["model_name"])
    checkpoint_utils.check_config_compatible(tmp_path / "none", {"model_name": "b"}, ["model_name"])


def test_appending_after_a_torn_row_removes_the_fragment(tmp_path):
    path = tmp_path / "checkpoints.jsonl"
    path.write_text('{"name": "a", "state_path": "p"}\n{"name": "b", "sta')
    checkpoint_utils.save_checkpoint(_FakeClient(), "c", tmp_path, {"step": 3})
    assert [row["name"] for row in checkpoint_utils.load_checkpoints_file(tmp_path)] == ["a", "c"]


def _write_run(log_path, steps, checkpoint_step):
    log_path.mkdir(parents=True, exist_ok=True)
    (log_path / "config.json").write_text('{"model_name": "m", "lora_rank": 4, "learning_rate": 0.1}')
    (log_path / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": {s}}}\n' for s in steps))
    checkpoint_utils.save_checkpoint(_FakeClient(), f"{checkpoint_step:06d}", log_path, {"step": checkpoint_step})


def test_resume_point_drops_rows_past_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    _write_run(run, steps=[0, 1, 2, 3], checkpoint_step=2)  # killed after logging step 3
    resume = checkpoint_utils.resume_point(run, "resume", {"model_name": "m", "lora_rank": 4, "learning_rate": 1})
    assert resume.row["name"] == "000002"
    assert resume.begin(start_step=2, end_step=6)
    assert [row["step"] for row in ml_log.read_metrics(run)] == [0, 1]


def test_resume_point_of_a_finished_run_does_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run, steps=[0, 1, 2, 3], checkpoint_step=4)
    resume = checkpoint_utils.resume_point(run, "resume", {"model_name": "m", "lora_rank": 4})
    assert not resume.begin(start_step=4, end_step=4)
    assert "Nothing to do" in capsys.readouterr().out
    assert [row["step"] for row in ml_log.read_metrics(run)] == [0, 1, 2, 3]


def test_resume_point_refuses_another_run_and_applies_the_log_dir_policy(tmp_path):
    run = tmp_path / "run"
    _write_run(run, steps=[0], checkpoint_step=1)
    with pytest.raises(ConfigurationError, match=r"(?s)model_name: 'm' \(in the log dir\) != 'other'.*lora_rank: 4"):
        checkpoint_utils.resume_point(run, "resume", {"model_name": "other", "lora_rank": 8})
    with pytest.raises(ConfigurationError, match="behavior_if_log_dir_exists=resume"):
        checkpoint_utils.resume_point(run, "raise", {"model_name": "m"})
    fresh = checkpoint_utils.resume_point(run, "delete", {"model_name": "other"})
    assert fresh.row is None and not run.exists()
