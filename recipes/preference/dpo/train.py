"""DPO through the shared loop (``tinker_cookbook.preference.train_dpo``).

    python -m recipes.preference.dpo.train                     # SmolLM2-135M-Instruct, the example pairs, CPU
    python -m recipes.preference.dpo.train model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test
    python -m recipes.preference.dpo.train dataset=jsonl dataset.train_path=pairs.jsonl dataset.test_size=64
    python -m recipes.preference.dpo.train dataset=hhh renderer_name=role_colon learning_rate=1e-5 dpo_beta=0.1 \\
        model_name=meta-llama/Llama-3.2-1B                     # the docs' run, where the model and hub are available

Default task: ``example-data/preferences/`` (the chosen reply follows a format instruction in the prompt, the
rejected one breaks it; 192 train pairs, 64 held-out pairs about unseen subjects), one epoch of 24 steps of 8
pairs at learning rate 6e-4, beta 0.1. ``test/accuracy`` (held-out pairs whose implicit reward prefers the chosen
reply) goes from 0.5 at step 0 (policy = reference: every margin is 0) to about 0.9; the README has the measured
curve and time.

The command line sets any field of the loop's ``Config`` (``--help`` lists them), plus these short names:
``dataset`` = ``dataset_builder.comparison_builder`` (``example``, ``jsonl``, ``hhh``, ``helpsteer3``,
``ultrafeedback``; ``dataset.<field>=...`` sets its fields), ``batch_size`` (pairs per step) and ``max_length``.
Writes ``metrics.jsonl``, ``checkpoints.jsonl``, ``config.json`` and ``logs.log`` under ``log_path``; run it again
to resume (``behavior_if_log_dir_exists=resume|delete``; it asks on a terminal and stops without one).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import chz

from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.perf_env import reexec_with_fast_malloc
from tinker_cookbook.preference import train_dpo

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_COMMON = "dataset_builder.common_config"
SHORT_NAMES = {
    "dataset": "dataset_builder.comparison_builder",
    "batch_size": f"{_COMMON}.batch_size",
    "max_length": f"{_COMMON}.max_length",
}

# Listed by --help; the value itself reaches the config as dataset_builder.comparison_builder (expanded above).
DATASET = RecipeKey(
    "dataset", "example",
    "Short for dataset_builder.comparison_builder: 'example' (the project's pairs), 'jsonl' (your own, with "
    "dataset.train_path=...), or the hub's 'hhh', 'helpsteer3', 'ultrafeedback'; dataset.<field>=... sets its fields.",
)

# The recipe's defaults, written as command-line arguments that come before the user's (the last value of a key
# wins). ``key@=other`` makes a field follow another: the data is tokenized and rendered for the trained model.
DEFAULT_ARGS = [
    f"model_name={DEFAULT_MODEL}",
    f"log_path={Path(tempfile.gettempdir()) / 'tinker-examples' / 'dpo'}",
    "recipe_name=preference/dpo",
    "dataset=example",
    "renderer_name=None",  # None: the model's recommended renderer (a reference needs a value to point to)
    f"{_COMMON}.model_name_for_tokenizer@=model_name",
    f"{_COMMON}.renderer_name@=renderer_name",
    "batch_size=8",
    "max_length=256",
    "learning_rate=6e-4",  # LoRA on a 135M model; about half the SFT rate of hyperparam_utils.get_lr
    "dpo_beta=0.1",
    "lora_rank=32",
    "eval_every=6",
    "save_every=12",
]


def expand_short_names(argv: Sequence[str]) -> list[str]:
    """``dataset=hhh`` -> ``dataset_builder.comparison_builder=hhh``, ``dataset.x=1`` -> ``...comparison_builder.x=1``."""
    expanded = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        head, dot, rest = key.partition(".")
        expanded.append(f"{SHORT_NAMES.get(head, head)}{dot}{rest}{sep}{value}")
    return expanded


def recipe_argv(argv: Sequence[str]) -> list[str]:
    """The recipe's defaults followed by the user's arguments, short names expanded."""
    return expand_short_names([*DEFAULT_ARGS, *argv])


def build_config(argv: Sequence[str]) -> train_dpo.Config:
    """The loop's ``Config`` for these command-line arguments (a chz Blueprint over it, with the defaults above)."""
    return chz.Blueprint(train_dpo.Config).make_from_argv(recipe_argv(argv))


def main(config: train_dpo.Config) -> None:
    asyncio.run(train_dpo.main(config))


if __name__ == "__main__":
    reexec_with_fast_malloc()
    sys.argv[1:] = recipe_argv(sys.argv[1:])
    run_recipe(main, recipe_keys=[DATASET])
