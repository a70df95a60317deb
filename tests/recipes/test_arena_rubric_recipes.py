"""Smoke tests: the text_arena, rubric, shorter and verifiers_rl recipes run end to end (tiny random model, 1
iteration), in this process: each recipe's blueprint with command-line style arguments, then its main. (Their
command lines are exercised by tests/test_docs_paths.py, which runs each with --help.)"""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest

TINY = "tinker-cookbook/tiny-smollm2"


@pytest.mark.parametrize(("module", "extra", "keys", "pages"), [
    ("tinker_cookbook.recipes.multiplayer_rl.text_arena.train",
     ["dataset_builder.batch_size=1", "dataset_builder.games_per_group=1", "dataset_builder.test_games=2",
      "max_tokens=4"],
     ["test/env/vs_random/win", "test/env/vs_initial/win", "env/all/illegal_move"], ["train", "eval"]),
    ("recipes.rubric.train",
     ["dataset_builder.batch_size=1", "dataset_builder.group_size=2", "dataset_builder.grader_max_tokens=4",
      "max_tokens=4"],
     ["test/env/all/rubric_score", "env/all/grade_malformed"], ["train", "eval"]),
    ("recipes.preference.shorter.train",
     ["dataset_builder.batch_size=1", "dataset_builder.group_size=2", "max_tokens=4"],
     ["env/all/ac_tokens_per_turn", "env/all/win_fraction"], ["train"]),
    pytest.param("recipes.verifiers_rl.train",
                 ["dataset_builder.batch_size=2", "dataset_builder.group_size=2", 'dataset_builder.vf_env_args={"num_eval": 2}',
                  "max_tokens=4"],
                 ["env/all/correct_sum", "test/env/all/correct_sum"], ["train", "eval"],
                 marks=pytest.mark.skipif(importlib.util.find_spec("verifiers") is None, reason="needs verifiers")),
])
def test_recipe_runs_one_iteration(tmp_path, module, extra, keys, pages):
    log_path = tmp_path / "run"
    recipe = importlib.import_module(module)
    argv = [f"model_name={TINY}", "max_steps=1", "lora_rank=4", "eval_every=1", f"log_path={log_path}",
            "behavior_if_log_dir_exists=delete", *extra]
    recipe.main(recipe.blueprint().make_from_argv(argv))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    logged = {k for r in rows for k in r}
    assert set(keys) <= logged, sorted(set(keys) - logged)
    assert all((log_path / "iteration_000000" / f"{page}.html").exists() for page in pages)
