"""The three-stage RLHF pipeline: SFT policy, pairwise preference model, then RL of the policy against it.

    python -m recipes.preference.rlhf.rlhf_pipeline                            # all three stages, offline, CPU
    python -m recipes.preference.rlhf.rlhf_pipeline run_sft=False run_rm=False # stage 3 only, from saved stages
    python -m recipes.preference.rlhf.rlhf_pipeline run_sft=False run_rl=False # the preference model alone
    python -m recipes.preference.rlhf.rlhf_pipeline model_name=tinker-cookbook/tiny-smollm2 \\
        sft.max_steps=1 rm.max_steps=1 rl.max_steps=1                          # smoke test, seconds
    python -m recipes.preference.rlhf.rlhf_pipeline dataset=hub model_name=meta-llama/Llama-3.2-1B \\
        renderer_name=role_colon                    # the docs' data (no_robots, Anthropic HH), where the hub is reachable

1. **SFT** (``sft.*``, the supervised loop's ``Config``): the policy learns to answer the prompts.
2. **Preference model** (``rm.*``, the supervised loop again): a model of the same base learns to answer ``A`` or
   ``B`` after a prompt showing a conversation and two completions (``preference.preference_model``); its held-out
   accuracy (both orders, held-out pairs) is logged as ``preference/accuracy`` at the start and the end.
3. **RL** (``rl.*``, the RL loop's ``Config``): starting from the SFT weights, the policy samples
   ``rl.dataset_builder.group_size`` completions per prompt, the preference model plays them against each other
   (``preference.comparison_env``), and the reward is each completion's win fraction. Every ``rl.eval_every``
   iterations ``win_rate/win_rate`` measures the policy against the SFT policy on held-out prompts, judged by the
   preference model in both completion orders.

Default task (``dataset=example``, ``example-data/rlhf/``): short factual questions; the labeller prefers a full
helpful sentence over a curt bare answer over an evasive non-answer. The SFT demonstrations mix the three styles,
so the SFT policy is helpful only some of the time; RL moves it towards what the preference model prefers.
``dataset=hub`` uses HuggingFaceH4/no_robots for SFT and Anthropic/hh-rlhf for the preference model and the RL
prompts (as in the docs).

Each stage writes its own directory under ``log_path`` (``sft/``, ``rm/``, ``rl/``, each with ``metrics.jsonl``,
``checkpoints.jsonl``, ``config.json``, ``logs.log``) and hands its last checkpoint to the next stage: the SFT
``state_path`` is where RL starts and its ``sampler_path`` the win rate's reference; the preference model's
``sampler_path`` is the judge. Run the same command again after an interruption: a finished stage is skipped
(``behavior_if_log_dir_exists=resume``, the default here) and an interrupted one continues from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chz
from chz.blueprint import Reference

from tinker_cookbook import checkpoint_utils, cli_utils, hyperparam_utils
from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.eval.custom_evaluators import (
    ComparisonEvaluatorBuilder,
    PreferenceAccuracyEvaluatorBuilder,
)
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.preference.comparison_env import PairwisePreferenceRLDatasetBuilder
from tinker_cookbook.preference.preference_datasets import (
    RLHF_DATA_DIR,
    HHHComparisonBuilder,
    RLHFExampleComparisonBuilder,
)
from tinker_cookbook.preference.preference_model import PreferenceModelBuilder, PreferenceModelDatasetBuilder
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.chat_datasets import NoRobotsBuilder
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import resolve_renderer_name

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATASET = RecipeKey(
    "dataset", "example",
    "'example': the project's offline data (example-data/rlhf/); 'hub': HuggingFaceH4/no_robots for SFT and "
    "Anthropic/hh-rlhf for the preference model and RL prompts (need the Hugging Face hub or its cache).",
)
STAGES = ("sft", "rm", "rl")
RECIPE = "rlhf"  # names the default log_path (cli_utils.default_log_path)


@chz.chz
class Config:
    """The pipeline: one config per stage, plus what they share."""

    sft: sl_train.Config
    """Stage 1: supervised fine-tuning of the policy."""
    rm: sl_train.Config
    """Stage 2: supervised training of the pairwise preference model."""
    rl: rl_train.Config
    """Stage 3: RL of the SFT policy against the preference model (its start weights and judge are filled in)."""
    model_name: str
    """The base model of the policy and of the preference model."""
    log_path: str
    """The pipeline's directory; each stage logs to its own sub-directory (sft/, rm/, rl/)."""
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    behavior_if_log_dir_exists: cli_utils.LogdirBehavior = "resume"
    """Applied to each stage that runs: resume (skip a finished stage, continue an interrupted one), delete, raise."""
    run_sft: bool = True
    """Run stage 1 (False: use the checkpoint already in log_path/sft)."""
    run_rm: bool = True
    """Run stage 2 (False: use the checkpoint already in log_path/rm)."""
    run_rl: bool = True
    """Run stage 3."""
    win_rate_samples_per_prompt: int = 2
    """Replies per held-out prompt (policy and SFT reference each) in the win-rate evaluation of stage 3."""
    win_rate_max_prompts: int | None = None
    """Held-out prompts in the win-rate evaluation (None: all distinct test prompts)."""


# ---------------------------------------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------------------------------------


def _dataset_defaults(name: str) -> dict[str, Any]:
    if name == "example":
        comparisons: Any = RLHFExampleComparisonBuilder
        return {
            "sft.dataset_builder": FromConversationFileBuilder,
            "sft.dataset_builder.file_path": str(RLHF_DATA_DIR / "sft.jsonl"),
            "sft.dataset_builder.test_size": 16,
            "rm.dataset_builder.comparison_builder": comparisons,
            "rl.dataset_builder.comparison_builder": comparisons,
        }
    if name == "hub":
        return {
            "sft.dataset_builder": NoRobotsBuilder,
            "rm.dataset_builder.comparison_builder": HHHComparisonBuilder,
            "rl.dataset_builder.comparison_builder": HHHComparisonBuilder,
            "rl.dataset_builder.max_prompts": 4096,
            "win_rate_max_prompts": 128,
        }
    raise ConfigurationError(f"dataset={name!r} is not known; use 'example' (offline) or 'hub'")


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[Config]:
    """The pipeline's defaults; the stages follow the top-level model, renderer and log-dir policy."""
    model = args.get("model_name", DEFAULT_MODEL)
    log_path = args.get("log_path", cli_utils.default_log_path(RECIPE))
    values: dict[str, Any] = {"model_name": model, "log_path": log_path, "behavior_if_log_dir_exists": "resume"}
    if "renderer_name" not in args:
        values["renderer_name"] = resolve_renderer_name(model, None)
    for stage in STAGES:
        values[f"{stage}.model_name"] = Reference("model_name")
        values[f"{stage}.renderer_name"] = Reference("renderer_name")
        values[f"{stage}.log_path"] = str(Path(log_path) / stage)
        values[f"{stage}.behavior_if_log_dir_exists"] = Reference("behavior_if_log_dir_exists")
    for stage in ("sft", "rm"):
        common = f"{stage}.dataset_builder.common_config."
        values[common + "model_name_for_tokenizer"] = Reference("model_name")
        values[common + "renderer_name"] = Reference("renderer_name")
        values[f"{stage}.recipe_name"] = f"preference/rlhf/{stage}"
    values.update({
        # Stage 1: one epoch over the demonstrations (10 steps of 16).
        "sft.dataset_builder.common_config.batch_size": 16,
        "sft.dataset_builder.common_config.max_length": 128,
        "sft.eval_every": 10,  # the held-out NLL before and after
        "sft.save_every": 5,
        # Stage 2: each comparison in both orders (8 comparisons = 16 datums a step), only the label token trained;
        # held-out accuracy (both orders) at the start and the end (an infrequent evaluator; eval_every adds the NLL).
        "rm.dataset_builder": PreferenceModelDatasetBuilder,
        "rm.dataset_builder.common_config.batch_size": 8,
        "rm.dataset_builder.common_config.max_length": 512,
        "rm.eval_every": 0,
        "rm.infrequent_eval_every": 1000,
        "rm.save_every": 8,
        # Stage 3: short replies, small groups, every pair judged in both orders.
        "rl.dataset_builder": PairwisePreferenceRLDatasetBuilder,
        "rl.dataset_builder.model_name": Reference("model_name"),
        "rl.dataset_builder.renderer_name": Reference("renderer_name"),
        "rl.dataset_builder.preference_model_builder.model_name": Reference("model_name"),
        "rl.dataset_builder.preference_model_builder.renderer_name": Reference("renderer_name"),
        "rl.dataset_builder.batch_size": 4,
        "rl.dataset_builder.group_size": 4,
        "rl.max_tokens": 20,
        "rl.max_steps": 24,
        "rl.eval_every": 12,  # the win rate against the SFT policy at the start, half-way and the end
        "rl.save_every": 4,
    })
    values.update(_dataset_defaults(args.get(DATASET.name, DATASET.default)))
    # Learning rates: SFT and the preference model at the model's suggested LoRA rate, RL at a quarter of it.
    lr_keys = {"sft.learning_rate": 1.0, "rm.learning_rate": 1.0, "rl.learning_rate": 0.35}
    if any(key not in args for key in lr_keys):
        base_lr = hyperparam_utils.get_lr(model)
        values.update({key: base_lr * factor for key, factor in lr_keys.items() if key not in args})
    return chz.Blueprint(Config).apply(values, layer_name="rlhf defaults")


# ---------------------------------------------------------------------------------------------------------
# Running the stages
# ---------------------------------------------------------------------------------------------------------


def handoff_checkpoint(log_path: str, stage: str, ran_now: bool) -> dict[str, Any]:
    """The checkpoint a stage hands on: its last row with both a ``state_path`` and a ``sampler_path``."""
    rows = [r for r in checkpoint_utils.load_checkpoints_file(log_path) if "state_path" in r and "sampler_path" in r]
    if not rows:
        raise ConfigurationError(f"stage {stage} has no checkpoint in {log_path}; run it first (run_{stage}=True) "
                                 "or point log_path at a pipeline directory that holds it")
    row = rows[-1]
    if not ran_now and not row.get("final"):
        logger.warning("stage %s in %s did not finish (last checkpoint %r); using it anyway", stage, log_path,
                       row.get("name"))
    return row


def stage2_config(cfg: Config) -> sl_train.Config:
    """The preference model's config, with its held-out accuracy (both orders) among the evaluators."""
    builder = cfg.rm.dataset_builder
    if not isinstance(builder, PreferenceModelDatasetBuilder):
        raise ConfigurationError(f"rm.dataset_builder must be a PreferenceModelDatasetBuilder, not "
                                 f"{type(builder).__name__}")
    accuracy = PreferenceAccuracyEvaluatorBuilder(comparison_builder=builder.comparison_builder,
                                                  model_name=cfg.rm.model_name, renderer_name=cfg.rm.renderer_name)
    return chz.replace(cfg.rm, infrequent_evaluator_builders=[*cfg.rm.infrequent_evaluator_builders, accuracy])


def stage3_config(cfg: Config, sft: Mapping[str, Any], rm: Mapping[str, Any]) -> rl_train.Config:
    """The RL config with the hand-offs filled in: start from the SFT weights, judge with the preference model,
    and measure the win rate against the SFT policy on the held-out prompts."""
    builder = cfg.rl.dataset_builder
    if not isinstance(builder, PairwisePreferenceRLDatasetBuilder):
        raise ConfigurationError(f"rl.dataset_builder must be a PairwisePreferenceRLDatasetBuilder, not "
                                 f"{type(builder).__name__}")
    judge: PreferenceModelBuilder = chz.replace(builder.preference_model_builder, model_path=rm["sampler_path"])
    builder = chz.replace(builder, preference_model_builder=judge)
    win_rate = ComparisonEvaluatorBuilder(
        comparison_builder=builder.comparison_builder, preference_model_builder=judge,
        reference_model_path=sft["sampler_path"], model_name=builder.model_name, renderer_name=builder.renderer_name,
        max_tokens=cfg.rl.max_tokens, temperature=cfg.rl.temperature,
        samples_per_prompt=cfg.win_rate_samples_per_prompt, max_prompts=cfg.win_rate_max_prompts)
    return chz.replace(cfg.rl, load_checkpoint_path=sft["state_path"], dataset_builder=builder,
                       evaluator_builders=[*cfg.rl.evaluator_builders, win_rate])


async def run_pipeline(cfg: Config) -> None:
    if cfg.run_sft:
        logger.info("stage 1/3: SFT of the policy in %s", cfg.sft.log_path)
        await sl_train.main(cfg.sft)
    if cfg.run_rm:  # the preference model starts from the base weights: it needs no SFT checkpoint
        logger.info("stage 2/3: preference model in %s", cfg.rm.log_path)
        await sl_train.main(stage2_config(cfg))
    if cfg.run_rl:
        sft = handoff_checkpoint(cfg.sft.log_path, "sft", cfg.run_sft)
        rm = handoff_checkpoint(cfg.rm.log_path, "rm", cfg.run_rm)
        logger.info("stage 3/3: RL against the preference model in %s", cfg.rl.log_path)
        await rl_train.main(stage3_config(cfg, sft, rm))


def main(config: Config) -> None:
    asyncio.run(run_pipeline(config))


if __name__ == "__main__":
    run_recipe(main, blueprint, [DATASET], name=RECIPE)
