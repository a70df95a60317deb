"""The DPO loop end to end on the tiny model: files and metrics, reference logprobs once per pair, exact resume."""

from __future__ import annotations

import asyncio
import json

import pytest
from pref_helpers import TINY_MODEL, dpo_builder, write_pairs

from tinker_cookbook import checkpoint_utils, tinker
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.train_dpo import ReferenceLogprobs, compute_sequence_logprobs
from tinker_cookbook.utils import ml_log

STEP_KEYS = {"dpo_loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "num_pairs", "num_tokens",
             "learning_rate", "progress", "epoch", "time/total", "reference/num_computed"}
TEST_KEYS = {"test/dpo_loss", "test/accuracy", "test/margin", "test/chosen_reward", "test/rejected_reward",
             "test/num_pairs"}


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    # 8 train pairs in batches of 2 = a 4-step epoch; 3 held-out pairs
    root = tmp_path_factory.mktemp("pairs")
    return write_pairs(root / "train.jsonl", 8), write_pairs(root / "test.jsonl", 3, start=50)


def _config(log_path, data_files, **overrides) -> train_dpo.Config:
    train_path, test_path = data_files
    builder = dpo_builder(str(train_path), test_path=str(test_path))
    args = {"log_path": str(log_path), "model_name": TINY_MODEL, "dataset_builder": builder, "learning_rate": 5e-3,
            "dpo_beta": 0.5, "lora_rank": 4, "eval_every": 2, "save_every": 2, "behavior_if_log_dir_exists": "resume"}
    return train_dpo.Config(**{**args, **overrides})


def _run(config: train_dpo.Config) -> None:
    asyncio.run(train_dpo.main(config))


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, data_files):
    """One uninterrupted 4-step run."""
    log_path = tmp_path_factory.mktemp("straight")
    _run(_config(log_path, data_files))
    return log_path


def test_files_metrics_and_checkpoints(straight_run):
    rows = ml_log.read_metrics(straight_run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert STEP_KEYS <= set(row), STEP_KEYS - set(row)
        assert row["num_pairs"] == 2 and isinstance(row["num_pairs"], int)
        # margin and rewards are consistent: margin = chosen_reward - rejected_reward (beta applied once)
        assert row["margin"] == pytest.approx(row["chosen_reward"] - row["rejected_reward"], abs=1e-9)
    # held-out evaluation before steps 0 and 2, and on the final model in the last row
    assert [r["step"] for r in rows if "test/accuracy" in r] == [0, 2, 3]
    assert all(TEST_KEYS <= set(r) for r in rows if "test/accuracy" in r)
    first = rows[0]
    # step 0: policy = reference, evaluated with the same compute_logprobs: every margin is exactly 0, a tie
    assert first["test/margin"] == 0 and first["test/accuracy"] == 0.5 and first["test/num_pairs"] == 3
    assert first["test/dpo_loss"] == pytest.approx(0.6931471805599453, abs=1e-12)  # log 2
    assert rows[-1]["test/dpo_loss"] < first["test/dpo_loss"]  # it learns even in 4 tiny steps
    assert [r["learning_rate"] for r in rows] == pytest.approx([5e-3, 3.75e-3, 2.5e-3, 1.25e-3])
    assert [r["progress"] for r in rows] == [0.25, 0.5, 0.75, 1.0]
    config = json.loads((straight_run / "config.json").read_text())
    assert config["dpo_beta"] == 0.5 and config["renderer_name"] == "chatml"  # resolved from the dataset builder
    assert (straight_run / "logs.log").stat().st_size > 0
    ckpts = checkpoint_utils.load_checkpoints_file(straight_run)
    assert [(c["name"], c["step"], c["epoch"], c["batch"], c.get("final", False)) for c in ckpts] == [
        ("000002", 2, 0, 2, False), ("final", 4, 1, 0, True)]


def test_reference_logprobs_are_computed_once_per_sequence(tmp_path, data_files):
    _run(_config(tmp_path / "two_epochs", data_files, num_epochs=2, save_every=0))
    rows = ml_log.read_metrics(tmp_path / "two_epochs")
    counts = [r["reference/num_computed"] for r in rows]
    # 3 test pairs (evaluated first) + 2 train pairs per step in epoch 1, nothing new in epoch 2: 2 * (3 + 8) = 22
    assert counts == [6 + 4, 14, 18, 22, 22, 22, 22, 22]


def test_reference_cache_matches_compute_logprobs_and_counts_distinct_sequences(data_files):
    train, _ = dpo_builder(str(data_files[0]))()
    batch = train.get_batch(0)
    client = tinker.ServiceClient().create_sampling_client(base_model=TINY_MODEL)
    reference = ReferenceLogprobs(client)
    first = asyncio.run(reference.sums(batch))
    again = asyncio.run(reference.sums([batch[1], batch[0], batch[1]]))
    assert reference.num_computed == len(batch) == 4
    assert again == [first[1], first[0], first[1]]
    direct = asyncio.run(compute_sequence_logprobs(client, batch))
    # the same requests on the same weights: bf16 or fp32 sampler, the same numbers up to batching (~1e-3 in a
    # sum of ~20 bf16 logprobs of the tiny model, each off by at most ~1e-4 when batched differently)
    assert first == pytest.approx(direct, abs=2e-3)
    assert all(s < 0 for s in first)


def test_stopped_then_resumed_run_equals_the_uninterrupted_run(tmp_path, data_files, straight_run):
    log_path = tmp_path / "interrupted"
    _run(_config(log_path, data_files, max_steps=2))
    assert checkpoint_utils.get_last_checkpoint(log_path)["name"] == "000002"
    _run(_config(log_path, data_files))
    resumed, straight = ml_log.read_metrics(log_path), ml_log.read_metrics(straight_run)
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == [0, 1, 2, 3]
    for a, b in zip(resumed, straight, strict=True):
        for key in sorted((STEP_KEYS | TEST_KEYS) - {"time/total", "reference/num_computed"}):
            assert (key in a) == (key in b), (a["step"], key)
            if key in a:
                # The same weights and data; reference and evaluation logprobs come from the sampler, whose
                # batching of concurrent requests can differ between runs (bf16: ~1e-4 per logprob, times beta).
                assert a[key] == pytest.approx(b[key], abs=1e-3), (a["step"], key)
    assert [c["name"] for c in checkpoint_utils.load_checkpoints_file(log_path)] == ["000002", "final"]


def test_finished_run_rerun_is_a_noop_and_another_run_is_refused(straight_run, data_files, capsys):
    before = (straight_run / "metrics.jsonl").read_text()
    _run(_config(straight_run, data_files))
    assert "Nothing to do" in capsys.readouterr().out
    assert (straight_run / "metrics.jsonl").read_text() == before
    with pytest.raises(ConfigurationError, match=r"(?s)holds another run.*model_name"):
        _run(_config(straight_run, data_files, model_name="tinker-cookbook/tiny-qwen3"))


def test_config_validation_names_the_field(tmp_path, data_files):
    with pytest.raises(ValueError, match="dpo_beta=0.0"):
        _config(tmp_path, data_files, dpo_beta=0.0)
    with pytest.raises(ValueError, match="dpo_beta=nan"):
        _config(tmp_path, data_files, dpo_beta=float("nan"))
    with pytest.raises(ConfigurationError, match="renderer_name='role_colon' differs"):
        _run(_config(tmp_path / "x", data_files, renderer_name="role_colon"))
