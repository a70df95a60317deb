"""RL on math word problems through the shared loop (``tinker_cookbook.rl.train``).

    python -m recipes.math_rl.train                              # SmolLM2-135M-Instruct, GSM8K-style problems, CPU
    python -m recipes.math_rl.train model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test, seconds
    python -m recipes.math_rl.train source=hub                   # the real openai/gsm8k (hub or its cache)
    python -m recipes.math_rl.train env=arithmetic               # additions of 0..max_operand instead
    python -m recipes.math_rl.train source=hub model_name=meta-llama/Llama-3.1-8B-Instruct group_size=64 \\
        batch_size=32 learning_rate=8e-5 max_tokens=1024         # the official cookbook's GSM8K run
    python -m recipes.math_rl.train --help                       # every key, its default and what it does

The docs' spelling, ``python -m tinker_cookbook.recipes.math_rl.train``, runs this same file.

Default: grade-school word problems generated offline in GSM8K's format (``tinker_cookbook.rl.math_env``), 160
training problems = 20 iterations of 8 problems x 4 samples, a few solved examples first; the reply must end in
``\\boxed{answer}``; reward = correct - 0.1 * (no boxed answer). 64 held-out problems measure ``test/env/all/correct``
at the start and the end. Keys and files are those of ``recipes.rl_basic`` (``env`` picks the dataset builder; the shared
defaults are ``tinker_cookbook.rl.recipe_defaults``); this recipe differs in its defaults: GSM8K first, longer replies, and its own log directory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import chz

from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.recipe_defaults import env_defaults, small_model_rl

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENV = RecipeKey(
    "env", "gsm8k",
    "Picks dataset_builder and its settings: 'gsm8k' (grade-school word problems: generated offline, or the real "
    "set with source=hub) or 'arithmetic' (additions of 0..max_operand).",
)
GSM8K_DEFAULTS: dict[str, Any] = {
    "max_tokens": 128,  # a short worked solution and its \boxed{} answer
    "learning_rate": 1e-4,
    "eval_every": 20,
    "dataset_builder.group_size": 4,
    "dataset_builder.n_offline_train": 160,
}


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
    """``rl_basic``'s defaults for the chosen env, with GSM8K's own on top."""
    env = args.get(ENV.name, ENV.default)
    return chz.Blueprint(train.Config).apply({
        **small_model_rl(args, args.get("model_name", DEFAULT_MODEL)),
        **env_defaults(env, "math_rl"),
        **(GSM8K_DEFAULTS if env == "gsm8k" else {}),
    }, layer_name="math_rl defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint, [ENV], name="math_rl")
