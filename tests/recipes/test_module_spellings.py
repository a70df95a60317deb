"""The docs' spelling ``python -m tinker_cookbook.recipes.<name>`` runs the same code as ``python -m recipes.<name>``."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import recipes

REPO = Path(__file__).resolve().parents[2]
# The prefix makes walk_packages import sub-packages as recipes.<pkg> (a bare name could resolve elsewhere on sys.path).
RECIPE_MODULES = sorted(
    m.name.removeprefix("recipes.") for m in pkgutil.walk_packages(recipes.__path__, prefix="recipes.") if not m.ispkg
)


def test_there_are_recipes_to_check():
    assert {"sl_basic", "sl_loop", "rl_basic", "rl_loop", "quickstart"} <= set(RECIPE_MODULES)


@pytest.mark.parametrize("name", RECIPE_MODULES)
def test_both_spellings_resolve_to_one_file(name):
    ours = importlib.util.find_spec(f"recipes.{name}")
    docs = importlib.util.find_spec(f"tinker_cookbook.recipes.{name}")
    assert ours is not None and docs is not None
    if Path(docs.origin).resolve() != Path(ours.origin).resolve():
        # A module that stands for a library module (it replaces itself in sys.modules) reports the library file
        # once imported under one spelling; then both spellings must give that one module object.
        assert importlib.import_module(f"recipes.{name}") is importlib.import_module(f"tinker_cookbook.recipes.{name}")


def test_docs_spelling_runs_a_recipe(tmp_path):
    log_path = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tinker_cookbook.recipes.sl_loop", "model_name=tinker-cookbook/tiny-smollm2",
         "max_steps=1", f"log_path={log_path}", "lora_rank=4", "batch_size=4", "max_length=128",
         "behavior_if_log_dir_exists=delete"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train_mean_nll" in r] == [0]
