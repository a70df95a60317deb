"""Answer questions with a search tool, by multi-turn RL (``tinker_cookbook.tool_use.search`` on ``rl.train``).

    python -m recipes.search_tool.train                                       # SmolLM2-135M-Instruct, CPU
    python -m recipes.search_tool.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.search_tool.train model_name=Qwen/Qwen3-4B-Instruct-2507 renderer_name=qwen3_instruct \
        dataset_builder.prefill_first_call=false dataset_builder.batch_size=16 dataset_builder.group_size=8

Each episode is one question about an invented mini-encyclopedia (``example-data/search_tool/``, facts no model
knows): the model calls ``search`` (BM25 over the articles), reads the article and answers; reward 1 when the
answer contains the right one (normalised), minus ``format_penalty`` per malformed or bad call. By default the
first reply starts with the opening of a search call (``dataset_builder.prefill_first_call``), because the
untrained 135M model rarely opens one by itself. Watch ``env/all/episode/success`` and
``env/all/episode/tool_calls`` rise; ``test/env/closed_book/episode/success`` is the no-tool baseline. Needs the
``tool-use`` extra (``bm25s``). The recipe is a chz Blueprint of the loop's ``Config``: any field, or
``dataset_builder.<field>``, can be set on the command line (``--help`` lists them).
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.tool_use.search import SearchToolDatasetBuilder


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": "chatml_tools",
        "dataset_builder": SearchToolDatasetBuilder,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 4,
        "dataset_builder.group_size": 4,
        "dataset_builder.n_batches": 30,
        "dataset_builder.n_test_questions": 8,
        "dataset_builder.test_group_size": 2,
        "learning_rate": 2e-4,
        "max_tokens": 24,
        "remove_constant_reward_groups": True,
        "eval_every": 10,
        "save_every": 15,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="search_tool defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="search_tool")
