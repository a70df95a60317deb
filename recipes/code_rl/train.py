"""RL on Python coding problems, graded by unit tests run in a local sandbox (``tinker_cookbook.rl.code_env``).

    python -m recipes.code_rl.train                              # SmolLM2-135M-Instruct, the offline problems, CPU
    python -m recipes.code_rl.train model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test, seconds
    python -m recipes.code_rl.train source=deepcoder max_tokens=2048 model_name=Qwen/Qwen3-8B   # DeepCoder (hub)
    python -m recipes.code_rl.train isolation=bwrap wall_s=10     # require bubblewrap, longer runs
    python -m recipes.code_rl.train --help                       # every key, its default and what it does

The docs' spelling, ``python -m tinker_cookbook.recipes.code_rl.train``, runs this same file.

Default: 39 one-function problems of ``tinker_cookbook.rl.code_problems`` (13 more held out), 10 iterations of
8 problems x 4 samples, one solved example first. The reply's last ```python block is run against the problem's
assertions in the sandbox; reward = fraction of tests passed - 0.1 * (no code block, or cut off). The held-out
problems (4 samples each) measure ``test/env/all/correct`` at the start and the end. docs/code-rl.md says what the
sandbox protects against and what it does not.

Measured on 2 shared CPU cores (fast malloc on), 7.2 min for the 10 iterations: held-out ``test/env/all/correct``
0.29 -> 0.77 (``pass_fraction`` 0.38 -> 0.85); ``env/all/correct`` per iteration 0.31, 0.41, 0.47, 0.50, 0.66,
0.88, 0.78, 0.81, 0.69, 0.78.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import chz

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.code_env import CodeRLDatasetBuilder
from tinker_cookbook.rl.recipe_defaults import small_model_rl

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
N_BATCHES = 10
CODE_DEFAULTS: dict[str, Any] = {
    "max_tokens": 64,  # a one-function answer in its code fence is 20-40 tokens
    "eval_every": N_BATCHES,  # held-out evaluation at the start and the end
    "dataset_builder": CodeRLDatasetBuilder,
    "dataset_builder.group_size": 4,
    "dataset_builder.n_batches": N_BATCHES,
}


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
    """The shared small-model RL defaults (``recipe_defaults.small_model_rl``) with this recipe's on top."""
    return chz.Blueprint(train.Config).apply({
        **small_model_rl(args, args.get("model_name", DEFAULT_MODEL)),
        **CODE_DEFAULTS,
    }, layer_name="code_rl defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint, name="code_rl")
