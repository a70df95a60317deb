"""Supervised fine-tuning through the shared loop (``tinker_cookbook.supervised.train``).

    python -m recipes.sl_basic                                 # SmolLM2-135M-Instruct on example-data, CPU, minutes
    python -m recipes.sl_basic model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test, seconds
    python -m recipes.sl_basic dataset=my_conversations.jsonl  # your own {"messages": [...]} JSONL file
    python -m recipes.sl_basic model_name=Qwen/Qwen3-8B-Base dataset=HuggingFaceH4/no_robots batch_size=128 \\
        learning_rate=2e-4 max_length=4096                     # the Tinker docs' run, where model and hub are available
    python -m recipes.sl_basic --help                          # every key, its default and what it does

Default task: turn a description of a person into a four-line contact card (``example-data/conversations.jsonl``,
272 train / 48 held-out conversations, one epoch of 17 steps of 16). ``test/nll`` falls from about 0.9 (the base
model) to well under 0.2; see docs/recipes.md for the measured figures and time.

The keys are those of the loop's ``Config`` (nested ones such as ``dataset_builder.common_config.batch_size`` also
by their last part, ``batch_size=...``), plus ``dataset``, which picks the dataset builder. Writes
``metrics.jsonl``, ``checkpoints.jsonl``, ``config.json`` and ``logs.log`` under ``log_path``. Run it again to
resume: it asks first on a terminal; in a script pass ``behavior_if_log_dir_exists=resume`` (or ``delete``), since
without a terminal it stops instead of asking.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import chz

from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.recipe_defaults import chat_sft

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATASET = RecipeKey(
    "dataset", "example",
    "Picks dataset_builder and its settings: 'example' (the project's data, 48 conversations held out), a path to "
    "a .jsonl, .json, .csv or .parquet file, or any hub dataset id 'org/name' (needs the hub or its cache; "
    "'no_robots' and 'tulu3' are short names). Rows may be messages, ShareGPT, Alpaca or prompt/completion "
    "(detected); columns.prompt=question reads other column names (docs/data-formats.md).",
)


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults; the model-dependent ones follow ``model_name`` as given."""
    model = args.get("model_name", DEFAULT_MODEL)
    return chz.Blueprint(train.Config).apply({
        **chat_sft(args, model, args.get(DATASET.name, DATASET.default)),
        "recipe_name": "sl_basic",
    }, layer_name="sl_basic defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint, [DATASET], name="sl_basic")
