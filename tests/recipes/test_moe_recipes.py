"""Smoke tests: sl_basic and rl_basic run on the tiny Qwen3-MoE model (the engine's general path, the real Qwen3
tokenizer and renderer), one step each, as subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MOE = "tinker-cookbook/tiny-qwen3-moe"


@pytest.mark.parametrize(("module", "key", "extra"), [
    ("recipes.sl_basic", "train_mean_nll", ["max_length=128", "test_size=4"]),
    ("recipes.rl_basic", "env/all/reward/total", []),
])
def test_recipe_runs_a_step_on_the_tiny_moe_model(tmp_path: Path, module: str, key: str, extra: list[str]) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    log_path = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", module, f"model_name={MOE}", "max_steps=1", "lora_rank=4",
                             "batch_size=4", f"log_path={log_path}", *extra], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runs on the general transformers path" in result.stderr
    metrics = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics if key in m] == [0]
    assert json.loads((log_path / "config.json").read_text())["model_name"] == MOE
