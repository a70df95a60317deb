"""On-policy distillation through the shared RL loop: the student samples, the teacher grades every sampled token.

    python -m recipes.distillation.on_policy_distillation         # offline: SmolLM2 student, fine-tuned teacher
    python -m recipes.distillation.on_policy_distillation teacher_checkpoint=tinker://RUN/sampler_weights/final
    python -m recipes.distillation.on_policy_distillation model_name=tinker-cookbook/tiny-smollm2 \\
        teacher_model=tinker-cookbook/tiny-smollm2 max_steps=1        # smoke test, seconds
    python -m tinker_cookbook.recipes.distillation.on_policy_distillation model_name=Qwen/Qwen3-8B-Base \\
        teacher_model=Qwen/Qwen3-8B dataset=deepmath learning_rate=1e-4 groups_per_batch=1024 lora_rank=128 \\
        max_tokens=4096 max_steps=None                                # the docs' run, where models and hub exist

Per token of the student's replies, advantage = −kl_penalty_coef · (log p_student − log p_teacher), optionally
discounted over the later tokens (``kl_discount_factor``); the envs give no reward (``tinker_cookbook.distillation``).

Offline default: the student is SmolLM2-135M-Instruct, the teacher its fine-tune on the contact-card task by
``recipes.sl_basic`` (trained first when no ``teacher_model``/``teacher_checkpoint`` is given, about 4-5 minutes,
and reused by later runs; see ``recipes/distillation/teacher.py``), the prompts the task's 272 training prompts.
The held-out contact-card score (``inspect/contact_cards/card_format/accuracy``, greedy, the 48 conversations
sl_basic holds out) is logged every ``eval_every`` iterations and at the end, and printed next to the teacher's.
Metrics: ``teacher_kl`` (mean log p_student − log p_teacher of the sampled tokens) falls as the student learns.
"""

from __future__ import annotations

import asyncio

import chz

from recipes.distillation import teacher as offline_teacher
from recipes.distillation.student import (
    StudentKeys,
    prompts,
    report_against_teacher,
    resolve_teacher,
    rl_config,
)
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.distillation.datasets import DistillationDatasetConfig
from tinker_cookbook.eval.evaluators import EvaluatorBuilder
from tinker_cookbook.rl import train
from tinker_cookbook.supervised.types import resolve_renderer_name


@chz.chz
class CLIConfig(StudentKeys):
    """On-policy distillation of one dataset from one teacher (the official recipe's keys)."""

    teacher_model: str | None = None
    """The teacher's base model (same tokenizer as the student). None with no ``teacher_checkpoint``: the default
    teacher, ``recipes.sl_basic``'s fine-tune of ``model_name`` (trained first if not there yet)."""
    teacher_checkpoint: str | None = None
    """A ``sampler_weights`` checkpoint of the teacher (of ``teacher_model``, or of ``model_name`` when unset)."""
    dataset: str = "contact_cards"
    """The prompts: contact_cards, instructions (offline), deepmath, tulu3 (hub)."""
    groups_per_batch: int = 8
    """Prompts per iteration."""


async def cli_main(cli: CLIConfig) -> None:
    renderer_name = resolve_renderer_name(cli.model_name, cli.renderer_name)
    teacher = await resolve_teacher(cli.model_name, cli.teacher_model, cli.teacher_checkpoint, cli.progress)
    dataset = DistillationDatasetConfig(dataset_builder=prompts(cli, cli.dataset, cli.groups_per_batch, renderer_name),
                                        teacher_config=teacher)
    scored = cli.dataset == "contact_cards"
    evaluators: list[EvaluatorBuilder] = [offline_teacher.held_out_evaluator()] if scored else []
    await train.main(rl_config(cli, [dataset], renderer_name, "distillation_on_policy", evaluators))
    if scored:
        await report_against_teacher(cli.log_path, teacher)


def main(cli: CLIConfig) -> None:
    asyncio.run(cli_main(cli))


if __name__ == "__main__":
    run_recipe(main, name="distillation_on_policy")
