"""RL with verifiable rewards through the shared loop (``tinker_cookbook.rl.train``).

    python -m recipes.rl_basic                                  # SmolLM2-135M-Instruct, additions of 0-9, CPU
    python -m recipes.rl_basic max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test, seconds
    python -m recipes.rl_basic env=gsm8k model_name=meta-llama/Llama-3.1-8B group_size=16 batch_size=128 \\
        learning_rate=4e-5 max_tokens=256                        # the Tinker docs' GSM8K run, where the model is available
    python -m recipes.rl_basic --help                           # every key, its default and what it does

Default: 12 iterations of 8 problems × 8 samples, reward = correct − 0.1 · (reply cut off before its stop token).
Measured on 2 idle CPU cores (fast malloc on): 3.7 min for the 12 iterations (10–30 s each);
``env/all/correct`` per iteration 0.09, 0.17, 0.23, 0.27, 0.63, 0.50, 0.63, 0.52, 0.47, 0.61, 0.83, 0.83 and
``env/all/reward/total`` 0.08 → 0.83. An earlier run on a loaded machine (before ``forward_backward`` batched short
sequences) took 15 min with ``correct`` 0.11 → 0.98: the model learns to answer "x + y = z".

The keys are those of the loop's ``Config`` (nested ones such as ``dataset_builder.group_size`` also by their last
part, ``group_size=...``), plus ``env``, which picks the dataset builder. Writes ``metrics.jsonl``,
``checkpoints.jsonl``, ``config.json`` and ``iteration_NNNNNN/train.html`` under ``log_path``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chz.blueprint import Reference

from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.perf_env import reexec_with_fast_malloc
from tinker_cookbook.rl import train
from tinker_cookbook.rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.rl.math_env import Gsm8kDatasetBuilder

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENV = RecipeKey(
    "env", "arithmetic",
    "Picks dataset_builder and its settings: 'arithmetic' (additions of 0..max_operand, 12 batches) or 'gsm8k' "
    "(grade-school word problems: generated offline, or the real set with source=hub).",
)
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "arithmetic": {"dataset_builder": ArithmeticDatasetBuilder, "dataset_builder.n_batches": 12,
                   "dataset_builder.max_operand": 9},
    "gsm8k": {"dataset_builder": Gsm8kDatasetBuilder},
}


def default_log_path(name: str) -> str:
    return str(Path(tempfile.gettempdir()) / "tinker-examples" / name)


def defaults(args: Mapping[str, str]) -> dict[str, Any]:
    """The recipe's defaults over ``train.Config``; the dataset follows ``model_name``, ``renderer_name``, ``seed``."""
    from tinker_cookbook import model_info

    env = args.get(ENV.name, ENV.default)
    if env not in ENV_DEFAULTS:
        raise ConfigurationError(f"env={env!r} is not an environment of rl_basic; use one of {list(ENV_DEFAULTS)}")
    model = args.get("model_name", DEFAULT_MODEL)
    values: dict[str, Any] = {
        "model_name": model,
        "learning_rate": 3e-4,
        "max_tokens": 8,
        "log_path": default_log_path("rl_basic"),
        "remove_constant_reward_groups": True,
        "eval_every": 0,
        "seed": 0,
        **ENV_DEFAULTS[env],
        "dataset_builder.batch_size": 8,
        "dataset_builder.group_size": 8,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.seed": Reference("seed"),
    }
    if "renderer_name" not in args:  # only when not given: a model without a recommendation works with a value
        values["renderer_name"] = model_info.get_recommended_renderer_name(model)
    return values


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    reexec_with_fast_malloc()
    run_recipe(main, defaults, [ENV])
