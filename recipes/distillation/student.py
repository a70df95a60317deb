"""What the distillation recipes share besides the teacher: the student's keys, the RL loop's config with the
teacher term, the prompt datasets, and the printed comparison with the teacher."""

from __future__ import annotations

import json
from pathlib import Path

import chz

from recipes.distillation import teacher as offline_teacher
from tinker_cookbook.cli_utils import LogdirBehavior
from tinker_cookbook.distillation.datasets import (
    CompositeDatasetBuilder,
    DistillationDatasetConfig,
    PromptOnlyDatasetBuilder,
    TeacherConfig,
)
from tinker_cookbook.distillation.train_on_policy import TeacherKLShaperBuilder
from tinker_cookbook.eval.evaluators import EvaluatorBuilder
from tinker_cookbook.rl import train
from tinker_cookbook.utils.progress import ProgressMode


@chz.chz
class StudentKeys:
    """The keys of the distillation recipes besides the datasets and teachers: the student and the loop."""

    model_name: str = offline_teacher.DEFAULT_MODEL
    """The student."""
    lora_rank: int = 32
    """Rank of the student's LoRA adapter."""
    renderer_name: str | None = None
    """None: the student's recommended renderer (the teacher scores the student's rendering)."""
    load_checkpoint_path: str | None = None
    """Start the student from these weights (``tinker://.../weights/...``)."""
    group_size: int = 4
    """Student replies per prompt."""
    learning_rate: float = 3e-4
    """AdamW learning rate (constant); the default is rl_basic's for SmolLM2, about a fifth of its SFT rate (the
    official recipe's 1e-4 for 8B models is about a fifth of theirs)."""
    max_tokens: int = 40
    """The most tokens per student reply."""
    temperature: float = 1.0
    """The student's sampling temperature."""
    kl_penalty_coef: float = 1.0
    """Weight of the per-token reverse KL to the teacher."""
    kl_discount_factor: float = 0.0
    """Discount with which each token's term also counts for the earlier tokens of the reply (0: none)."""
    num_substeps: int = 1
    """Optimizer steps per iteration."""
    loss_fn: train.LossFnName = "importance_sampling"
    """The policy-gradient loss."""
    loss_fn_config: dict[str, float] | None = None
    """The loss's settings (e.g. clip thresholds of ppo)."""
    log_path: str = chz.field(munger=lambda _, s: str(Path(s).expanduser()))
    """The run's directory."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project."""
    wandb_name: str | None = None
    """The wandb run name."""
    eval_every: int = 5
    """Iterations between held-out evaluations (0: never)."""
    save_every: int = 20
    """Iterations between checkpoints (0: only the final one)."""
    base_url: str | None = None
    """None: the in-process engine; else a Tinker-protocol server."""
    behavior_if_log_dir_exists: LogdirBehavior = "ask"
    """When log_path holds a run: resume, delete, raise or ask."""
    max_steps: int | None = 15
    """Iterations (None: one pass over the prompts, or over the shortest dataset's)."""
    seed: int = 0
    """Seed of the prompt order, the LoRA initialisation and the sampling."""
    progress: ProgressMode = "auto"
    """The console display: bar, lines, table, off or auto."""


async def resolve_teacher(cfg_model: str, teacher_model: str | None, teacher_checkpoint: str | None,
                          progress: ProgressMode) -> TeacherConfig:
    """The teacher the keys name; with neither key, the default contact-card teacher of ``cfg_model``."""
    if teacher_model is None and teacher_checkpoint is None:
        path = await offline_teacher.default_teacher_checkpoint(cfg_model, progress)
        return TeacherConfig(base_model=cfg_model, load_checkpoint_path=path)
    return TeacherConfig(base_model=teacher_model or cfg_model, load_checkpoint_path=teacher_checkpoint)


def rl_config(cli: StudentKeys, dataset_configs: list[DistillationDatasetConfig], renderer_name: str,
              recipe_name: str, evaluators: list[EvaluatorBuilder]) -> train.Config:
    """The shared RL loop's config: the datasets with their teachers, and the teacher term as advantage shaper."""
    return train.Config(
        log_path=cli.log_path, model_name=cli.model_name, recipe_name=recipe_name, renderer_name=renderer_name,
        load_checkpoint_path=cli.load_checkpoint_path, lora_rank=cli.lora_rank, seed=cli.seed,
        max_steps=cli.max_steps, evaluator_builders=evaluators, eval_every=cli.eval_every, save_every=cli.save_every,
        base_url=cli.base_url, wandb_project=cli.wandb_project, wandb_name=cli.wandb_name, progress=cli.progress,
        behavior_if_log_dir_exists=cli.behavior_if_log_dir_exists, learning_rate=cli.learning_rate,
        dataset_builder=CompositeDatasetBuilder(dataset_configs=dataset_configs), max_tokens=cli.max_tokens,
        temperature=cli.temperature, loss_fn=cli.loss_fn, loss_fn_config=cli.loss_fn_config,
        num_substeps=cli.num_substeps,
        advantage_shaper=TeacherKLShaperBuilder(kl_penalty_coef=cli.kl_penalty_coef,
                                                kl_discount_factor=cli.kl_discount_factor))


def prompts(cli: StudentKeys, dataset: str, groups_per_batch: int, renderer_name: str) -> PromptOnlyDatasetBuilder:
    return PromptOnlyDatasetBuilder(dataset_name=dataset, groups_per_batch=groups_per_batch,
                                    group_size=cli.group_size, model_name_for_tokenizer=cli.model_name,
                                    renderer_name=renderer_name, seed=cli.seed)


def held_out_summary(log_path: str) -> str | None:
    """``first -> last`` of the held-out contact-card score in the run's metrics, or None when it was not logged."""
    rows = [json.loads(line) for line in (Path(log_path) / "metrics.jsonl").read_text().splitlines() if line]
    scored = [r for r in rows if offline_teacher.CARD_FORMAT in r]
    if not scored:
        return None
    first, last = scored[0], scored[-1]
    return (f"{first[offline_teacher.CARD_FORMAT]:.2f} (step {first['step']}) -> "
            f"{last[offline_teacher.CARD_FORMAT]:.2f} (step {last['step']})")


async def report_against_teacher(log_path: str, teacher: TeacherConfig) -> None:
    """Print the student's held-out card score over the run, and the teacher's."""
    student = held_out_summary(log_path)
    if student is None:
        return
    scores = await offline_teacher.TeacherScore(model_name=teacher.base_model,
                                                model_path=teacher.load_checkpoint_path)()
    print(f"held-out contact-card format: student {student}; teacher {scores[offline_teacher.CARD_FORMAT]:.2f}")
