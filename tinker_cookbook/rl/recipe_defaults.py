"""Defaults that the RL recipes over verifiable rewards share (``rl_basic``, ``math_rl``), as values for
``chz.Blueprint(train.Config).apply(...)``: the environments their ``env=`` key picks and the small-model setup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chz.blueprint import Reference

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.rl.math_env import Gsm8kDatasetBuilder

ENVS: dict[str, dict[str, Any]] = {
    "arithmetic": {"dataset_builder": ArithmeticDatasetBuilder, "dataset_builder.n_batches": 12,
                   "dataset_builder.max_operand": 9},
    "gsm8k": {"dataset_builder": Gsm8kDatasetBuilder},
}
"""``dataset_builder`` and its settings for each environment name."""


def env_defaults(env: str, recipe: str) -> dict[str, Any]:
    """``ENVS[env]``; an unknown name is a ``ConfigurationError`` that names ``recipe`` and the known ones."""
    if env not in ENVS:
        raise ConfigurationError(f"env={env!r} is not an environment of {recipe}; use one of {list(ENVS)}")
    return ENVS[env]


def small_model_rl(args: Mapping[str, str], model: str) -> dict[str, Any]:
    """RL of ``model`` with groups of 8 samples for 8 problems a step, short replies, constant-reward groups
    dropped, no periodic evaluation; the dataset follows the model, its renderer and the seed."""
    from tinker_cookbook import model_info

    values: dict[str, Any] = {
        "model_name": model,
        "learning_rate": 3e-4,
        "max_tokens": 8,
        "remove_constant_reward_groups": True,
        "eval_every": 0,
        "seed": 0,
        "dataset_builder.batch_size": 8,
        "dataset_builder.group_size": 8,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.seed": Reference("seed"),
    }
    if "renderer_name" not in args:  # only when not given: a model without a recommendation works with a value
        values["renderer_name"] = model_info.get_recommended_renderer_name(model)
    return values
