"""RL toward shorter replies, judged pairwise (``recipes.preference.shorter.env`` on ``tinker_cookbook.rl.train``).

    python -m recipes.preference.shorter.train                     # SmolLM2-135M-Instruct, length alone, offline prompts
    python -m recipes.preference.shorter.train max_steps=2 model_name=tinker-cookbook/tiny-smollm2   # smoke test
    python -m recipes.preference.rlhf.rlhf_pipeline run_sft=False run_rl=False log_path=/tmp/pm   # a preference model
    python -m recipes.preference.shorter.train dataset_builder.preference_model_builder.model_path=tinker://...
        # shorter only among replies that preference model (stage 2's sampler checkpoint) finds equally good

The recipe is a chz Blueprint of the loop's ``Config`` with the defaults below applied; any field of ``Config`` or
of the dataset builder can be set on the command line (``--help`` lists them). Each prompt (the questions of
``example-data/rlhf/``) gets ``group_size`` replies that play each other; a reply's reward is its win fraction under
``PreferenceModelShorter``. ``env/all/ac_tokens_per_turn`` (mean reply length in tokens) should fall.

With a preference model (``model_path``), every ``eval_every`` iterations (and at the start) the policy also plays
the initial policy on the held-out prompts, judged by that preference model alone (``ComparisonEvaluator``):
``pm_score/win_rate`` (0.5 = as good as before, more = better), ``pm_score/reply_tokens`` and
``pm_score/reference_reply_tokens`` (mean reply lengths in tokens, the policy's and the initial policy's).
"""

from __future__ import annotations

import asyncio

import chz
from chz.blueprint import Reference

from recipes.preference.shorter.env import ShorterPreferenceModelBuilder
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.eval.custom_evaluators import ComparisonEvaluatorBuilder
from tinker_cookbook.preference.comparison_env import PairwisePreferenceRLDatasetBuilder
from tinker_cookbook.preference.preference_datasets import RLHFExampleComparisonBuilder
from tinker_cookbook.preference.preference_model import PreferenceModelBuilder
from tinker_cookbook.rl import train

PM_SCORE = "pm_score"
EVAL_MAX_TOKENS = 128
"""The held-out replies' budget: twice the training one, so that the initial policy's replies are rarely cut off
(a cut-off reply loses its matchup unjudged, which would flatter a policy that learned to be short)."""


def blueprint() -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults applied (apply more, or ``make_from_argv``)."""
    return chz.Blueprint(train.Config).apply({
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "renderer_name": None,
        "dataset_builder": PairwisePreferenceRLDatasetBuilder,
        "dataset_builder.comparison_builder": RLHFExampleComparisonBuilder,
        "dataset_builder.preference_model_builder": ShorterPreferenceModelBuilder,
        "dataset_builder.preference_model_builder.model_name": Reference("model_name"),
        "dataset_builder.preference_model_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.model_name": Reference("model_name"),
        "dataset_builder.renderer_name": Reference("renderer_name"),
        "dataset_builder.batch_size": 4,
        "dataset_builder.group_size": 4,
        "dataset_builder.format_penalty": 0.5,
        "learning_rate": 3e-4,
        "max_tokens": 64,
        "max_steps": 10,
        "remove_constant_reward_groups": True,
        "eval_every": 10,
        "save_every": 10,
        "behavior_if_log_dir_exists": "ask",
    }, layer_name="shorter defaults")


def with_quality_evaluation(config: train.Config) -> train.Config:
    """With a preference model as the quality judge: add the held-out win rate against the initial policy under
    that model alone, and the replies' lengths (see the module doc). Length alone: the config unchanged."""
    builder = config.dataset_builder
    if not isinstance(builder, PairwisePreferenceRLDatasetBuilder):
        return config
    judge = builder.preference_model_builder
    if judge.model_path is None:
        return config
    quality = PreferenceModelBuilder(model_name=judge.model_name, renderer_name=judge.renderer_name,
                                     model_path=judge.model_path)
    evaluator = ComparisonEvaluatorBuilder(
        comparison_builder=builder.comparison_builder, preference_model_builder=quality,
        reference_base_model=config.model_name, model_name=builder.model_name, renderer_name=builder.renderer_name,
        max_tokens=EVAL_MAX_TOKENS, temperature=config.temperature, samples_per_prompt=2, name=PM_SCORE)
    return chz.replace(config, evaluator_builders=[*config.evaluator_builders, evaluator])


def main(config: train.Config) -> None:
    asyncio.run(train.main(with_quality_evaluation(config)))


if __name__ == "__main__":
    run_recipe(main, blueprint(), name="shorter")
