"""The distillation recipes run end to end on the tiny model (one step each), with the teacher's term logged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import chz
import pytest

from recipes.distillation import off_policy_reasoning, on_policy_distillation, on_policy_multi_teacher
from recipes.distillation import teacher as offline_teacher
from tinker_cookbook.exceptions import ConfigurationError

TINY = "tinker-cookbook/tiny-smollm2"
SMALL = {"model_name": TINY, "lora_rank": 4, "max_steps": 1, "eval_every": 0, "progress": "off",
         "behavior_if_log_dir_exists": "delete"}


def _rows(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_on_policy_logs_teacher_kl_and_trains(tmp_path):
    cli = on_policy_distillation.CLIConfig(**SMALL, teacher_model=TINY, log_path=str(tmp_path / "run"),
                                           groups_per_batch=2, group_size=2, max_tokens=6)
    asyncio.run(on_policy_distillation.cli_main(cli))
    (row,) = _rows(tmp_path / "run")
    # Teacher and student are the same weights at step 0, so the estimate is ~0 (up to the sampler's float noise).
    assert abs(row["teacher_kl"]) < 1e-3 and row["teacher_kl/dataset_0"] == row["teacher_kl"]
    assert row["optim/num_datums"] == 4.0


def test_multi_teacher_logs_each_datasets_teacher_kl(tmp_path):
    cli = on_policy_multi_teacher.CLIConfig(
        **SMALL, contact_cards_teacher_model=TINY, contact_cards_groups_per_batch=1, instructions_groups_per_batch=2,
        group_size=2, max_tokens=4, log_path=str(tmp_path / "run"))
    asyncio.run(on_policy_multi_teacher.cli_main(cli))
    (row,) = _rows(tmp_path / "run")
    assert {"teacher_kl", "teacher_kl/dataset_0", "teacher_kl/dataset_1"} <= set(row)
    assert row["optim/num_datums"] == 6.0  # (1 + 2) prompts × 2 replies
    with pytest.raises(ConfigurationError, match="distinct prompt sets"):
        chz.replace(cli, datasets=["contact_cards", "nope"])


def test_off_policy_writes_teacher_data_then_fine_tunes_on_it(tmp_path):
    data = tmp_path / "teacher.jsonl"
    cli = off_policy_reasoning.CLIConfig(**SMALL, teacher_model=TINY, data_file=str(data), max_prompts=4,
                                         teacher_max_tokens=6, keep_truncated=True, batch_size=2,
                                         log_path=str(tmp_path / "run"))
    asyncio.run(off_policy_reasoning.cli_main(cli))
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == 4 and {r["teacher"] for r in rows} == {TINY}
    assert [r["step"] for r in _rows(tmp_path / "run") if "train_mean_nll" in r] == [0]


@pytest.mark.slow  # a whole sl_basic run on the tiny model: about 50 s on a busy 2-core machine
def test_the_default_teacher_is_trained_once_then_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(offline_teacher, "teacher_log_path", lambda: str(tmp_path / "teacher"))
    first = asyncio.run(offline_teacher.default_teacher_checkpoint(TINY, "off"))
    assert first.endswith("/sampler_weights/final")
    rows = (tmp_path / "teacher" / "metrics.jsonl").read_text()
    assert asyncio.run(offline_teacher.default_teacher_checkpoint(TINY, "off")) == first  # the finished run is kept
    assert (tmp_path / "teacher" / "metrics.jsonl").read_text() == rows
