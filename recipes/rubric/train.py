"""Rubric-graded RL (``tinker_cookbook.rl.rubric`` on ``tinker_cookbook.rl.train``).

    python -m recipes.rubric.train                            # SmolLM2-135M-Instruct, graded by itself, offline set
    python -m recipes.rubric.train dataset_builder.grader=text   # a written score read by each criterion's regex
    python -m recipes.rubric.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.rubric.train dataset_builder.grader_model=Qwen/Qwen3-8B   # a stronger grader, where available
    python -m recipes.rubric.train dataset_builder.train_file=my_rubrics.jsonl dataset_builder.test_file=None

The recipe is a chz Blueprint of the loop's ``Config`` with the defaults below applied; any field of ``Config`` or
of the dataset builder (``dataset_builder.<field>``) can be set on the command line (``--help`` lists them).
The policy replies to each instruction; each of the instruction's criteria is graded on its own, by default as
the grader's P(Yes) / (P(Yes) + P(No)) after a yes/no question (``dataset_builder.grader=text``: a written score,
a malformed one scoring 0); the reward is the weighted mean of the scores. ``env/all/rubric_score`` and, on the
held-out topics, ``test/env/all/rubric_score`` (every ``eval_every`` iterations) are the mean rubric scores;
``env/all/grade_malformed`` is the share of criteria whose written grade was unreadable (always 0 by probability).
Regenerate the data with ``python -m recipes.rubric.generate_data``.
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.rubric import RubricGradedDatasetBuilder


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": RubricGradedDatasetBuilder,
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 4,
        "dataset_builder.group_size": 4,
        "dataset_builder.num_epochs": 1,
        "learning_rate": 3e-4,
        "max_tokens": 48,
        "max_steps": None,  # one epoch of the offline set: 33 steps, about 12 minutes on 2 CPU cores
        "remove_constant_reward_groups": True,
        "eval_every": 5,
        "save_every": 11,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="rubric defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="rubric")
