"""Tic-tac-toe self-play RL (``tinker_cookbook.rl.multiturn.text_arena`` on ``tinker_cookbook.rl.train``).

    python -m recipes.multiplayer_rl.text_arena.train                  # SmolLM2-135M-Instruct plays itself, CPU
    python -m recipes.multiplayer_rl.text_arena.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.multiplayer_rl.text_arena.train dataset_builder.train_opponent=random   # train against random
    python -m recipes.multiplayer_rl.text_arena.train dataset_builder.test_opponents='[random,checkpoint]' \
        dataset_builder.opponent_checkpoint=tinker://...                 # test against a saved policy too

The recipe is a chz Blueprint of the loop's ``Config`` with the defaults below applied; any field of ``Config`` or
of the dataset builder (``dataset_builder.<field>``) can be set on the command line (``--help`` lists them).
Both seats of each game are the policy; a group is ``games_per_group`` games (both seats of each), so a seat's
return is centred against the other seats' of its group; a move is a cell in square brackets, an illegal move ends the game with ``illegal_move_reward``.
Every ``eval_every`` iterations the policy plays ``test_games`` games against a random player and against the
initial policy: ``test/env/vs_random/win`` and ``test/env/vs_initial/win`` are the win rates.
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.multiturn.text_arena import TwoPlayerTextArenaDatasetBuilder


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": TwoPlayerTextArenaDatasetBuilder,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 2,
        "dataset_builder.games_per_group": 4,
        "dataset_builder.num_batches": 40,
        "dataset_builder.test_games": 16,
        "learning_rate": 3e-4,
        "max_tokens": 8,
        "remove_constant_reward_groups": True,
        "eval_every": 10,
        "save_every": 20,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="text_arena defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="text_arena")
