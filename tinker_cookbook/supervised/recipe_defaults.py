"""Defaults that the supervised recipes share, as values for ``chz.Blueprint(train.Config).apply(...)``.

``chat_sft`` is the chat fine-tuning setup of ``sl_basic`` and ``chat_sl``; ``chat_dataset`` is what their
``dataset=`` key picks; ``follow_the_model`` makes the renderer, the learning rate and the data's tokenizer follow
``model_name`` as given on the command line (every recipe over the supervised loop uses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import chz
from chz.blueprint import Reference

from tinker_cookbook import hyperparam_utils
from tinker_cookbook.supervised.chat_datasets import get_chat_dataset_builder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig, resolve_renderer_name

COMMON = "dataset_builder.common_config."
"""The path of the chat datasets' shared settings (tokenizer, renderer, batch size, length limit)."""


def follow_the_model(args: Mapping[str, str], model: str) -> dict[str, Any]:
    """``renderer_name`` and ``learning_rate`` for ``model``, each only when not given on the command line (so a
    model without a recommendation or known dimensions works with explicit values), and the data rendered and
    tokenized as the trained model is."""
    values: dict[str, Any] = {
        COMMON + "model_name_for_tokenizer": Reference("model_name"),
        COMMON + "renderer_name": Reference("renderer_name"),
    }
    if "renderer_name" not in args:
        values["renderer_name"] = resolve_renderer_name(model, None)
    if "learning_rate" not in args:
        values["learning_rate"] = hyperparam_utils.get_lr(model)
    return values


def chat_dataset(name: str) -> dict[str, Any]:
    """``dataset_builder`` and its own settings for a dataset name, as ``get_chat_dataset_builder`` chooses them."""
    placeholder = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer="", batch_size=1)
    builder = get_chat_dataset_builder(name, placeholder)
    values: dict[str, Any] = {"dataset_builder": type(builder)}
    # An empty mapping (the builder's columns) is left to its default: chz takes ``columns.prompt=...`` on the
    # command line only when the mapping itself was not given a value.
    values.update({f"dataset_builder.{key}": getattr(builder, key)
                   for key in chz.chz_fields(type(builder))
                   if key != "common_config" and getattr(builder, key) != {}})
    return values


def chat_sft(args: Mapping[str, str], model: str, dataset: str) -> dict[str, Any]:
    """Chat fine-tuning of ``model`` on ``dataset``: batches of 16 conversations cut to 256 tokens, the test loss
    every 6 steps and a checkpoint every 8."""
    return {
        "model_name": model,
        "eval_every": 6,
        "save_every": 8,
        **chat_dataset(dataset),
        COMMON + "batch_size": 16,
        COMMON + "max_length": 256,
        **follow_the_model(args, model),
    }
