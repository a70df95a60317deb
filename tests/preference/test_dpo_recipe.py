"""The DPO recipe: runs end to end as a subprocess on the tiny model; the docs' command line parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pref_helpers import TINY_MODEL

from recipes.preference.dpo import train as dpo
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.preference_datasets import ExampleComparisonBuilder, HHHComparisonBuilder

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, module: str = "recipes.preference.dpo.train") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=600)


def build_config(argv: list[str]) -> train_dpo.Config:
    """The recipe's config for a command line, as ``python -m recipes.preference.dpo.train`` builds it."""
    made: list[train_dpo.Config] = []
    run_recipe(made.append, dpo.blueprint(), [dpo.DATASET], name="dpo", argv=argv)
    return made[0]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_recipe_runs_two_steps_on_the_example_pairs_and_a_rerun_is_a_noop(tmp_path):
    log_path = tmp_path / "run"
    args = (f"model_name={TINY_MODEL}", "max_steps=2", f"log_path={log_path}", "lora_rank=4", "batch_size=4",
            "behavior_if_log_dir_exists=resume")
    result = _run(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(log_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all({"dpo_loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "num_pairs", "num_tokens",
                "learning_rate", "progress"} <= set(r) for r in rows)
    assert rows[0]["test/num_pairs"] == 64 and rows[0]["num_pairs"] == 4
    assert _rows(log_path / "checkpoints.jsonl")[-1]["step"] == 2
    config = json.loads((log_path / "config.json").read_text())
    assert config["model_name"] == TINY_MODEL and config["recipe_name"] == "preference/dpo"
    assert config["dataset_builder"]["common_config"]["model_name_for_tokenizer"] == TINY_MODEL

    again = _run(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to do" in again.stdout
    assert _rows(log_path / "metrics.jsonl") == rows


def test_the_docs_command_line_parses_and_fails_fast_offline(tmp_path):
    docs_args = [f"log_path={tmp_path / 'dpo-hhh-experiment'}", "model_name=meta-llama/Llama-3.2-1B", "dataset=hhh",
                 "renderer_name=role_colon", "learning_rate=1e-5", "dpo_beta=0.1"]
    config = build_config(docs_args)
    assert isinstance(config.dataset_builder.comparison_builder, HHHComparisonBuilder)
    assert (config.learning_rate, config.dpo_beta, config.renderer_name) == (1e-5, 0.1, "role_colon")
    common = config.dataset_builder.common_config
    assert (common.model_name_for_tokenizer, common.renderer_name) == ("meta-llama/Llama-3.2-1B", "role_colon")

    result = _run(*docs_args, module="tinker_cookbook.recipes.preference.train")  # the docs' module path
    assert result.returncode == 1
    assert "Error: dataset=hhh needs 'Anthropic/hh-rlhf'" in result.stderr and "dataset=example" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "dpo-hhh-experiment").exists()


def test_defaults_and_short_names():
    config = build_config([])
    assert config.model_name == "HuggingFaceTB/SmolLM2-135M-Instruct" and config.renderer_name is None
    assert isinstance(config.dataset_builder.comparison_builder, ExampleComparisonBuilder)
    assert config.dataset_builder.common_config.model_name_for_tokenizer == config.model_name
    jsonl = build_config(["dataset=jsonl", "dataset.train_path=a.jsonl", "dataset.test_size=4", "max_length=64"])
    assert jsonl.dataset_builder.comparison_builder.train_path == "a.jsonl"
    assert jsonl.dataset_builder.common_config.max_length == 64
