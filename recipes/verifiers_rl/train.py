"""RL on a ``verifiers`` environment (``tinker_cookbook.rl.verifiers_env`` on ``tinker_cookbook.rl.train``).

    python -m recipes.verifiers_rl.train                    # the offline example env (additions), SmolLM2-135M-Instruct
    python -m recipes.verifiers_rl.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.verifiers_rl.train dataset_builder.vf_env_id=reverse_text   # an installed hub environment

Needs the ``verifiers`` package (``pip install 'verifiers==0.1.9.post3'``). The recipe is a chz Blueprint of
the loop's ``Config`` with the defaults below applied; any field of ``Config`` or of the dataset builder
(``dataset_builder.<field>``, e.g. ``dataset_builder.vf_env_args``) can be set on the command line. The
environment runs its own rollouts; the adapter answers its model requests with the policy's samples and rewards
each rollout with the environment's rubric (``env/all/reward/total``; the rubric's metrics as ``env/all/<name>``).
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl import train
from tinker_cookbook.rl.verifiers_env import VerifiersRLDatasetBuilder


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": VerifiersRLDatasetBuilder,
        "dataset_builder.vf_env_id": "recipes.verifiers_rl.example_env:load_environment",
        "dataset_builder.model_name_for_tokenizer": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 8,
        "dataset_builder.group_size": 8,
        "learning_rate": 3e-4,
        "max_tokens": 8,
        "max_steps": 12,
        "remove_constant_reward_groups": True,
        "eval_every": 6,
        "save_every": 12,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="verifiers_rl defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="verifiers_rl")
