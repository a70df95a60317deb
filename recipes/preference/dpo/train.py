"""DPO through the shared loop (``tinker_cookbook.preference.train_dpo``).

    python -m recipes.preference.dpo.train                     # SmolLM2-135M-Instruct, the example pairs, CPU
    python -m recipes.preference.dpo.train model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test
    python -m recipes.preference.dpo.train dataset=jsonl dataset.train_path=pairs.jsonl dataset.test_size=64
    python -m recipes.preference.dpo.train dataset=hhh renderer_name=role_colon learning_rate=1e-5 dpo_beta=0.1 \\
        model_name=meta-llama/Llama-3.2-1B                     # the docs' run, where the model and hub are available

Default task: ``example-data/preferences/`` (the chosen reply follows a format instruction in the prompt, the
rejected one breaks it; 192 train pairs, 64 held-out pairs about unseen subjects), one epoch of 24 steps of 8
pairs at learning rate 6e-4, beta 0.1. ``test/accuracy`` (held-out pairs whose implicit reward prefers the chosen
reply) goes from 0.5 at step 0 (policy = reference: every margin is 0) to about 0.9; docs/recipes.md has the measured
curve and time.

The command line sets any field of the loop's ``Config`` (``--help`` lists them; a nested one also by its last
part: ``batch_size`` (pairs per step), ``max_length``), plus ``dataset``, short for
``dataset_builder.comparison_builder`` (``example``, ``jsonl``, ``hhh``, ``helpsteer3``, ``ultrafeedback``;
``dataset.<field>=...`` sets its fields).
Writes ``metrics.jsonl``, ``checkpoints.jsonl``, ``config.json`` and ``logs.log`` under ``log_path``; run it again
to resume (``behavior_if_log_dir_exists=resume|delete``; it asks on a terminal and stops without one).
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.preference_datasets import ExampleComparisonBuilder

COMMON = "dataset_builder.common_config."
DATASET = RecipeKey(
    "dataset", "example",
    "Short for dataset_builder.comparison_builder: 'example' (the project's pairs), 'jsonl' (your own, with "
    "dataset.train_path=...), or the hub's 'hhh', 'helpsteer3', 'ultrafeedback'; dataset.<field>=... sets its fields.",
    short_for="dataset_builder.comparison_builder",
)


def blueprint() -> chz.Blueprint[train_dpo.Config]:
    """The loop's Config with this recipe's defaults: the data is tokenized and rendered for the trained model."""
    return chz.Blueprint(train_dpo.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "recipe_name": "preference/dpo",
        "dataset_builder.comparison_builder": ExampleComparisonBuilder,
        "renderer_name": None,  # None: the model's recommended renderer (a reference needs a value to point to)
        COMMON + "model_name_for_tokenizer": Reference("model_name"),
        COMMON + "renderer_name": Reference("renderer_name"),
        COMMON + "batch_size": 8,
        COMMON + "max_length": 256,
        "learning_rate": 6e-4,  # LoRA on a 135M model; about half the SFT rate of hyperparam_utils.get_lr
        "dpo_beta": 0.1,
        "lora_rank": 32,
        "eval_every": 6,
        "save_every": 12,
    }, layer_name="preference/dpo defaults")


def main(config: train_dpo.Config) -> None:
    asyncio.run(train_dpo.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), [DATASET], name="dpo")
