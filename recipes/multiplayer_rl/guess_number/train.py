"""Guess the number with multi-turn RL (``tinker_cookbook.rl.multiturn.guess_number`` on ``tinker_cookbook.rl.train``).

    python -m recipes.multiplayer_rl.guess_number.train                    # SmolLM2-135M-Instruct, numbers 1-10, CPU
    python -m recipes.multiplayer_rl.guess_number.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.multiplayer_rl.guess_number.train model_name=Qwen/Qwen3-4B-Instruct-2507 dataset_builder.low=0 \
        dataset_builder.high=1024 dataset_builder.max_turns=10 dataset_builder.format_penalty=1.0 \
        dataset_builder.include_example=false dataset_builder.batch_size=32 dataset_builder.group_size=8 \
        dataset_builder.n_batches=100 learning_rate=3e-5 max_tokens=64   # the docs' settings, where available

The recipe is a chz Blueprint of the loop's ``Config`` with the defaults below applied; any field of ``Config`` or
of the dataset builder (``dataset_builder.<field>``) can be set on the command line (``--help`` lists them).
Each episode is one conversation: the player guesses, the env answers "Too low." / "Too high." until the number
is found or the turns run out; reward 1 for finding it, ``-format_penalty`` for each reply without a
``Guess: <number>`` line. The turns of an episode train as one datum (the chatml renderer's observations extend).
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.multiturn.guess_number import GuessNumberDatasetBuilder


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": GuessNumberDatasetBuilder,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 4,
        "dataset_builder.group_size": 4,
        "dataset_builder.n_batches": 20,
        "dataset_builder.low": 1,
        "dataset_builder.high": 10,
        "dataset_builder.max_turns": 5,
        "dataset_builder.format_penalty": 0.2,
        "dataset_builder.n_test_games": 8,
        "dataset_builder.test_group_size": 2,
        "learning_rate": 1e-4,
        "max_tokens": 10,
        "remove_constant_reward_groups": True,
        "eval_every": 5,
        "save_every": 12,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="guess_number defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="guess_number")
