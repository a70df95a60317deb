"""Smoke tests: the RL recipes run end to end as subprocesses (tiny random model, 2 steps) and write their files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = "tinker-cookbook/tiny-smollm2"


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The Tinker documentation names both with its spelling (the same files: tests/recipes/test_module_spellings.py).
@pytest.mark.parametrize("module", ["tinker_cookbook.recipes.rl_basic", "tinker_cookbook.recipes.rl_loop"])
def test_recipe_runs_two_steps(tmp_path, module):
    log_path = tmp_path / "run"
    result = _run(module, f"model_name={TINY}", "max_steps=2", f"log_path={log_path}", "lora_rank=4",
                  "behavior_if_log_dir_exists=delete")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _rows(log_path / "metrics.jsonl")
    reward_key = "env/all/reward/total" if module.endswith("rl_basic") else "reward/total"
    assert [m["step"] for m in metrics if reward_key in m] == [0, 1]
    assert _rows(log_path / "checkpoints.jsonl")[-1]["name"] == "final"
    assert (log_path / "config.json").exists()


def test_rl_basic_rejects_a_bad_argument(tmp_path):
    result = _run("recipes.rl_basic", "env=chess", f"log_path={tmp_path}")
    assert result.returncode != 0 and "env" in (result.stderr + result.stdout)
