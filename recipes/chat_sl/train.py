"""Supervised fine-tuning on chat datasets through the shared loop (``tinker_cookbook.supervised.train``).

    python -m recipes.chat_sl.train                             # SmolLM2-135M-Instruct on the example data, CPU
    python -m recipes.chat_sl.train model_name=tinker-cookbook/tiny-smollm2 max_steps=2   # smoke test, seconds
    python -m recipes.chat_sl.train dataset=no_robots            # HuggingFaceH4/no_robots (hub or its cache)
    python -m recipes.chat_sl.train dataset=tulu3                # allenai/tulu-3-sft-mixture (hub or its cache)
    python -m recipes.chat_sl.train dataset=my_conversations.jsonl   # your own rows: messages, ShareGPT, Alpaca, ...
    python -m recipes.chat_sl.train dataset=example-data/contact_cards.csv columns.prompt=description columns.completion=card
    python -m recipes.chat_sl.train dataset=org/big-sft-set dataset_builder.streaming=true dataset_builder.max_rows=20000
    python -m recipes.chat_sl.train model_name=meta-llama/Llama-3.1-8B dataset=no_robots batch_size=256 \\
        learning_rate=1e-4 max_length=16384 eval_every=20 save_every=20   # the official cookbook's run
    python -m recipes.chat_sl.train --help                       # every key, its default and what it does

The docs' spelling, ``python -m tinker_cookbook.recipes.chat_sl.train``, runs this same file.

The hub datasets need the Hugging Face hub or a copy in its local cache: offline, ``dataset=no_robots`` stops within
seconds with one ``Error:`` line that names the offline alternatives instead of retrying. The default,
``dataset=example``, is the project's conversations (works offline). Hub rows that cannot train (no assistant
tokens within ``max_length``) are skipped. Keys, files written and resuming are those of ``recipes.sl_basic`` (the same defaults,
``tinker_cookbook.supervised.recipe_defaults.chat_sft``); this recipe differs only in its name, its log directory
and the official cookbook's schedule (linear decay).
"""

from __future__ import annotations

from collections.abc import Mapping

import chz

from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.recipe_defaults import chat_sft

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATASET = RecipeKey(
    "dataset", "example",
    "Picks dataset_builder and its settings: 'example' (the project's conversations, works offline), "
    "'no_robots' / 'HuggingFaceH4/no_robots', 'tulu3' / 'allenai/tulu-3-sft-mixture', any other hub id "
    "'org/name' (hub or its cache), or a path to a .jsonl, .json, .csv or .parquet file. Rows may be messages, "
    "ShareGPT, Alpaca or prompt/completion (detected); columns.prompt=question reads other column names.",
)


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
    """The chat fine-tuning defaults of ``sl_basic`` under this recipe's name, with a linear decay."""
    model = args.get("model_name", DEFAULT_MODEL)
    return chz.Blueprint(train.Config).apply({
        **chat_sft(args, model, args.get(DATASET.name, DATASET.default)),
        "recipe_name": "chat_sl",
        "lr_schedule": "linear",
    }, layer_name="chat_sl defaults")


def main(config: train.Config) -> None:
    train.run(config)


if __name__ == "__main__":
    run_recipe(main, blueprint, [DATASET], name="chat_sl")
