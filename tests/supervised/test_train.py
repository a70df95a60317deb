"""The SFT loop end to end on the tiny model: files written, exact resume, log-dir policy."""

import asyncio
import json
from typing import ClassVar

import pandas
import pytest
from sl_helpers import TINY_MODEL, write_conversations

from tinker_cookbook import checkpoint_utils
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.utils import ml_log

STEP_KEYS = {"train_mean_nll", "progress", "learning_rate", "num_tokens", "num_loss_tokens", "num_sequences",
             "epoch", "time/total"}


def _config(log_path, data_file, model=TINY_MODEL, **overrides) -> train.Config:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=model, renderer_name="chatml", max_length=64,
                                            batch_size=4)
    builder = FromConversationFileBuilder(common_config=common, file_path=str(data_file), test_size=4)
    args = dict(log_path=str(log_path), model_name=model, dataset_builder=builder, learning_rate=5e-3,
                lora_rank=4, eval_every=2, save_every=2, behavior_if_log_dir_exists="resume",
                num_examples_to_show=0)
    args.update(overrides)
    return train.Config(**args)


def _run(config: train.Config) -> None:
    asyncio.run(train.main(config))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    # 20 conversations: 4 test, 16 train = 4 batches of 4 = a 4-step run
    return write_conversations(tmp_path_factory.mktemp("data") / "conversations.jsonl", 20)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, data_file):
    """One uninterrupted 4-step run."""
    log_path = tmp_path_factory.mktemp("straight")
    _run(_config(log_path, data_file))
    return log_path


def test_metrics_config_and_checkpoint_files(straight_run):
    rows = ml_log.read_metrics(straight_run)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for row in rows:
        assert STEP_KEYS <= set(row), STEP_KEYS - set(row)
        assert row["num_sequences"] == 4 and row["num_loss_tokens"] > 0 and row["num_tokens"] > row["num_loss_tokens"]
    # evaluators: before step 0, before step 2, and on the final model (in the last row, after its step)
    assert [row["step"] for row in rows if "test/nll" in row] == [0, 2, 3]
    # linear schedule over 4 steps: lr * (1, 0.75, 0.5, 0.25); progress = (step + 1) / 4
    assert [row["learning_rate"] for row in rows[:4]] == pytest.approx([5e-3, 3.75e-3, 2.5e-3, 1.25e-3])
    assert [row["progress"] for row in rows] == [0.25, 0.5, 0.75, 1.0]
    assert rows[-1]["test/nll"] < rows[0]["test/nll"]  # it learns something even in 4 tiny steps

    df = pandas.read_json(straight_run / "metrics.jsonl", lines=True)  # the docs' snippet works as written
    assert len(df["train_mean_nll"].dropna()) == 4 and len(df["test/nll"].dropna()) == 3
    # the sweep page's completeness check and final loss read the last row
    assert df["progress"].iloc[-1] >= 0.98 and df["train_mean_nll"].iloc[-1].item() == rows[-1]["train_mean_nll"]
    config = json.loads((straight_run / "config.json").read_text())
    assert config["learning_rate"] == 5e-3 and config["model_name"] == TINY_MODEL
    assert (straight_run / "logs.log").stat().st_size > 0

    ckpts = checkpoint_utils.load_checkpoints_file(straight_run)
    assert [(c["name"], c["step"], c["epoch"], c["batch"], c.get("final", False)) for c in ckpts] == [
        ("000002", 2, 0, 2, False), ("final", 4, 1, 0, True),
    ]
    assert all(c["state_path"].startswith("tinker://") and "/sampler_weights/" in c["sampler_path"] for c in ckpts)


def test_stopped_then_resumed_run_equals_the_uninterrupted_run(tmp_path, data_file, straight_run):
    log_path = tmp_path / "interrupted"
    _run(_config(log_path, data_file, max_steps=2))
    assert checkpoint_utils.get_last_checkpoint(log_path)["name"] == "000002"
    # The process dies while recording a later checkpoint: a torn row must not be resumed from.
    with open(log_path / "checkpoints.jsonl", "a") as f:
        f.write('{"name": "000003", "step": 3, "epoch": 0, "ba')
    _run(_config(log_path, data_file))

    resumed, straight = ml_log.read_metrics(log_path), ml_log.read_metrics(straight_run)
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == [0, 1, 2, 3]
    for a, b in zip(resumed, straight):
        for key in ("train_mean_nll", "test/nll", "learning_rate", "progress", "num_tokens", "num_loss_tokens"):
            assert (key in a) == (key in b), (a["step"], key)
            if key in a:
                assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)
    names = [c["name"] for c in checkpoint_utils.load_checkpoints_file(log_path)]
    assert names == ["000002", "final"]


def test_finished_run_rerun_is_a_noop(straight_run, data_file, capsys):
    before = (straight_run / "metrics.jsonl").read_text()
    _run(_config(straight_run, data_file))
    assert "Nothing to do" in capsys.readouterr().out
    assert (straight_run / "metrics.jsonl").read_text() == before


def test_resuming_a_log_path_of_another_run_is_refused(straight_run, data_file, tmp_path):
    with pytest.raises(ConfigurationError, match=r"(?s)holds another run.*model_name"):
        _run(_config(straight_run, data_file, model="tinker-cookbook/tiny-qwen3"))
    other_data = write_conversations(tmp_path / "other.jsonl", 24)
    with pytest.raises(ConfigurationError, match=r"(?s)holds another run.*dataset_builder.file_path"):
        _run(_config(straight_run, other_data))


def test_ask_without_a_terminal_and_raise_policy(straight_run, data_file):
    for behavior in ("ask", "raise"):
        with pytest.raises(ConfigurationError, match="behavior_if_log_dir_exists=resume"):
            _run(_config(straight_run, data_file, behavior_if_log_dir_exists=behavior))


def test_config_validation_names_the_field(tmp_path, data_file):
    with pytest.raises(ValueError, match="lr_schedule='exponential'"):
        _config(tmp_path, data_file, lr_schedule="exponential")
    with pytest.raises(ValueError, match="max_steps=0"):
        _config(tmp_path, data_file, max_steps=0)


class _PhaseRecorder:
    """An evaluator that records the phase the run's progress display shows while it runs."""

    seen: ClassVar[list[str]] = []

    async def __call__(self, training_client) -> dict[str, float]:
        from tinker_cookbook.utils import progress

        current = progress.current()
        self.seen.append(current.current_phase if current is not None else "none")
        return {}


def test_progress_lines_off_a_terminal_and_the_table_on_request(tmp_path, data_file, capsys):
    _PhaseRecorder.seen = []
    _run(_config(tmp_path / "lines", data_file, evaluator_builders=[_PhaseRecorder], recipe_name="sft"))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("sft step")]
    # capsys is not a terminal: auto mode prints one line per step (4 steps), plus one for the final evaluation.
    assert [line.split(" | ")[0] for line in lines[:4]] == [f"sft step {s}/4 {25 * s}%" for s in range(1, 5)]
    assert all("ETA" in line and "tok/s" in line and "train_mean_nll=" in line for line in lines)
    assert "test/nll=" in lines[-1]
    assert _PhaseRecorder.seen and set(_PhaseRecorder.seen) == {"evaluating"}
    _run(_config(tmp_path / "table", data_file, progress="table", max_steps=1))
    out = capsys.readouterr().out
    assert "sft step" not in out and "step 0" in out and "train_mean_nll" in out
