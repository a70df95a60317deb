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
at the start and the end. Keys and files are those of ``recipes.rl_basic`` (``env`` picks the dataset builder);
this recipe differs in its defaults: GSM8K first, longer replies, and its own log directory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from recipes import rl_basic
from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.perf_env import reexec_with_fast_malloc
from tinker_cookbook.rl import train

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


def defaults(args: Mapping[str, str]) -> dict[str, Any]:
    """``recipes.rl_basic``'s defaults for the chosen env, with GSM8K's own on top."""
    env = args.get(ENV.name, ENV.default)
    values = dict(rl_basic.defaults({**args, rl_basic.ENV.name: env}))
    values["log_path"] = rl_basic.default_log_path("math_rl")
    if env == "gsm8k":
        values.update(GSM8K_DEFAULTS)
    return values


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    reexec_with_fast_malloc()
    run_recipe(main, defaults, [ENV])
