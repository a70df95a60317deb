"""RL toward shorter replies, judged pairwise (``recipes.preference.shorter.env`` on ``tinker_cookbook.rl.train``).

    python -m recipes.preference.shorter.train                     # SmolLM2-135M-Instruct, length alone, offline prompts
    python -m recipes.preference.shorter.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.preference.shorter.train dataset_builder.preference_model_builder.model_path=tinker://...
        # shorter only among replies RLHF's stage-2 preference model (that sampler checkpoint) finds equally good

The recipe is a chz Blueprint of the loop's ``Config`` with the defaults below applied; any field of ``Config`` or
of the dataset builder can be set on the command line (``--help`` lists them). Each prompt (the questions of
``example-data/rlhf/``) gets ``group_size`` replies that play each other; a reply's reward is its win fraction under
``PreferenceModelShorter``. ``env/all/ac_tokens_per_turn`` (mean reply length in tokens) should fall.
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from recipes.preference.shorter.env import ShorterPreferenceModelBuilder
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.preference.comparison_env import PairwisePreferenceRLDatasetBuilder
from tinker_cookbook.preference.preference_datasets import RLHFExampleComparisonBuilder
from tinker_cookbook.rl import train


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": PairwisePreferenceRLDatasetBuilder,
        "dataset_builder.comparison_builder": RLHFExampleComparisonBuilder,
        "dataset_builder.preference_model_builder": ShorterPreferenceModelBuilder,
        "dataset_builder.preference_model_builder.model_name": Reference("model_name"),
        "dataset_builder.model_name": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 4,
        "dataset_builder.group_size": 4,
        "dataset_builder.format_penalty": 0.5,
        "learning_rate": 3e-4,
        "max_tokens": 64,
        "max_steps": 20,
        "remove_constant_reward_groups": True,
        "eval_every": 0,
        "save_every": 20,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="shorter defaults")


def main(config: train.Config) -> None:
    asyncio.run(train.main(config))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="shorter")
