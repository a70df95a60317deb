"""Twenty questions with multi-turn, two-model RL (``tinker_cookbook.rl.multiturn.twenty_questions`` on
``tinker_cookbook.rl.train``).

    python -m recipes.multiplayer_rl.twenty_questions.train        # SmolLM2-135M-Instruct plays and answers (animals)
    python -m tinker_cookbook.recipes.multiplayer_rl.twenty_questions.train # the docs' module path: the same recipe
    python -m recipes.multiplayer_rl.twenty_questions.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.multiplayer_rl.twenty_questions.train model_name=meta-llama/Llama-3.1-8B-Instruct \
        dataset_builder.word_list=nouns dataset_builder.include_example=false dataset_builder.max_questions=20 \
        dataset_builder.batch_size=64 dataset_builder.num_epochs=100 dataset_builder.test_group_size=32 \
        dataset_builder.answerer_max_tokens=5 learning_rate=3e-5 max_tokens=20 eval_every=5 save_every=20 \
        max_steps=None                                             # the docs' settings, where the model is available

The recipe is a chz Blueprint of the loop's ``Config`` with the defaults below applied; any field of ``Config`` or
of the dataset builder (``dataset_builder.<field>``) can be set on the command line (``--help`` lists them).
The player (the policy) asks questions; the answerer is a sampling client of ``dataset_builder.answerer_model``
(by default the player's own base model, served from the same loaded weights) that sees the secret word and the
latest question only. ``test/env/all/reward/total`` (unseen words) is logged every ``eval_every`` iterations.
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.multiturn.twenty_questions import TwentyQuestionsDatasetBuilder


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": TwentyQuestionsDatasetBuilder,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 2,
        "dataset_builder.group_size": 8,
        "dataset_builder.max_questions": 5,
        "dataset_builder.word_list": "animals",
        "dataset_builder.test_group_size": 2,
        "learning_rate": 3e-4,
        "max_tokens": 16,
        "max_steps": 12,
        "remove_constant_reward_groups": True,
        "eval_every": 4,
        "save_every": 12,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="twenty_questions defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="twenty_questions")
