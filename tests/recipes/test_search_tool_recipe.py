"""Smoke test: the search_tool recipe runs end to end under the docs' module spelling (tiny random model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_search_tool_recipe_runs_and_reports_tool_metrics(tmp_path: Path) -> None:
    log_path = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tinker_cookbook.recipes.search_tool.train", "model_name=tinker-cookbook/tiny-smollm2",
         "max_steps=1", f"log_path={log_path}", "behavior_if_log_dir_exists=delete", "lora_rank=4", "max_tokens=8",
         "dataset_builder.batch_size=2", "dataset_builder.group_size=2", "dataset_builder.n_test_questions=1",
         "dataset_builder.test_group_size=1", "eval_every=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = next(r for r in rows if "env/all/episode/tool_calls" in r)
    assert 0 <= train["env/all/episode/success"] <= 1
    stops = [v for k, v in train.items() if k.startswith("env/all/episode/stop/")]
    assert len(stops) == 4 and abs(sum(stops) - 1.0) < 1e-9  # every episode has exactly one stop reason
    test = next(r for r in rows if "test/env/closed_book/episode/success" in r)
    assert "test/env/with_tool/episode/tool_calls" in test
    html = (log_path / "iteration_000000" / "train.html").read_text()
    assert "episode_end" in html and "turn 0 prompt" in html
