"""Smoke tests: the multi-turn recipes run end to end as subprocesses (tiny random model, 2 iterations)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = "tinker-cookbook/tiny-smollm2"
SMALL = ["dataset_builder.batch_size=2", "dataset_builder.group_size=2", "dataset_builder.test_group_size=1",
         "max_tokens=6", "lora_rank=4", "eval_every=1"]


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("module", "extra"), [
    ("recipes.multiplayer_rl.guess_number.train", ["dataset_builder.n_test_games=2", "dataset_builder.max_turns=3"]),
    ("tinker_cookbook.recipes.multiplayer_rl.twenty_questions.train", ["dataset_builder.max_test_words=2",
                                                       "dataset_builder.max_questions=3"]),
])
def test_multiturn_recipe_runs_two_iterations(tmp_path, module, extra):
    log_path = tmp_path / "run"
    result = _run(module, f"model_name={TINY}", "max_steps=2", f"log_path={log_path}",
                  "behavior_if_log_dir_exists=delete", *SMALL, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _rows(log_path / "metrics.jsonl")
    assert [m["step"] for m in metrics if "env/all/reward/total" in m] == [0, 1]
    # eval_every=1: the test set before each iteration and after the last one.
    assert [m["step"] for m in metrics if "test/env/all/reward/total" in m] == [0, 1, 2]
    train_rows = [m for m in metrics if "env/all/reward/total" in m]
    assert all(m["env/all/episode/turns"] >= 1 for m in train_rows)
    assert _rows(log_path / "checkpoints.jsonl")[-1]["name"] == "final"
    html = (log_path / "iteration_000001" / "train.html").read_text()
    assert "turn 0 prompt" in html and "player" in html


def test_multiturn_recipe_names_a_bad_argument(tmp_path):
    result = _run("recipes.multiplayer_rl.guess_number.train", "dataset_builder.hgh=3", f"log_path={tmp_path}")
    assert result.returncode != 0 and "hgh" in result.stderr


def test_multiturn_recipe_reports_a_user_error_in_one_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    result = _run("recipes.multiplayer_rl.twenty_questions.train", f"model_name={TINY}", f"log_path={tmp_path}",
                  "behavior_if_log_dir_exists=raise")
    assert result.returncode == 1
    assert "Error: log_path=" in result.stderr and "Traceback" not in result.stderr
