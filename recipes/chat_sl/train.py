"""Supervised fine-tuning on chat datasets through the shared loop (``tinker_cookbook.supervised.train``).

    python -m recipes.chat_sl.train                             # SmolLM2-135M-Instruct on the example data, CPU
    python -m recipes.chat_sl.train model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test, seconds
    python -m recipes.chat_sl.train dataset=no_robots            # HuggingFaceH4/no_robots (hub or its cache)
    python -m recipes.chat_sl.train dataset=tulu3                # allenai/tulu-3-sft-mixture (hub or its cache)
    python -m recipes.chat_sl.train dataset=my_conversations.jsonl   # your own {"messages": [...]} rows
    python -m recipes.chat_sl.train model_name=meta-llama/Llama-3.1-8B dataset=no_robots batch_size=256 \\
        learning_rate=1e-4 max_length=16384 eval_every=20 save_every=20   # the official cookbook's run
    python -m recipes.chat_sl.train --help                       # every key, its default and what it does

The docs' spelling, ``python -m tinker_cookbook.recipes.chat_sl.train``, runs this same file.

The hub datasets need the Hugging Face hub or a copy in its local cache: offline, ``dataset=no_robots`` stops within
seconds with one ``Error:`` line that names the offline alternatives instead of retrying. The default,
``dataset=example``, is the project's conversations (works offline). Hub rows that cannot train (no assistant
tokens within ``max_length``) are skipped. Keys, files written and resuming are those of ``recipes.sl_basic``; this
recipe differs only in its name, its log directory and the official cookbook's schedule (linear decay).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from recipes import sl_basic
from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.perf_env import reexec_with_fast_malloc
from tinker_cookbook.supervised import train

DATASET = RecipeKey(
    "dataset", "example",
    "Picks dataset_builder and its settings: 'example' (the project's conversations, works offline), "
    "'no_robots' / 'HuggingFaceH4/no_robots', 'tulu3' / 'allenai/tulu-3-sft-mixture' (hub or its cache), "
    "or a path to a .jsonl file of {\"messages\": [...]} rows.",
)


def defaults(args: Mapping[str, str]) -> dict[str, Any]:
    """``recipes.sl_basic``'s defaults under this recipe's name and log directory."""
    values = dict(sl_basic.defaults(args))
    values.update({
        "recipe_name": "chat_sl",
        "log_path": sl_basic.default_log_path("chat_sl"),
        "lr_schedule": "linear",
    })
    return values


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    reexec_with_fast_malloc()
    run_recipe(main, defaults, [DATASET])
