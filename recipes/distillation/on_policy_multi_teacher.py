"""On-policy distillation from several teachers at once: each dataset's prompts are graded by that dataset's teacher.

    python -m recipes.distillation.on_policy_multi_teacher      # offline: contact cards + instructions, two teachers
    python -m recipes.distillation.on_policy_multi_teacher model_name=tinker-cookbook/tiny-smollm2 \\
        contact_cards_teacher_model=tinker-cookbook/tiny-smollm2 max_steps=1 eval_every=0     # smoke test
    python -m tinker_cookbook.recipes.distillation.on_policy_multi_teacher model_name=Qwen/Qwen3-8B \\
        datasets=deepmath,tulu3 deepmath_teacher_model=Qwen/Qwen3-32B tulu3_teacher_model=Qwen/Qwen3-235B-A22B \\
        deepmath_groups_per_batch=256 tulu3_groups_per_batch=256 learning_rate=1e-4 lora_rank=128 max_tokens=4096

``datasets`` names the prompt sets of the run (``tinker_cookbook.distillation.datasets.PROMPT_SETS``); each has its
``<name>_teacher_model``, ``<name>_teacher_checkpoint`` and ``<name>_groups_per_batch`` keys. A batch holds the
groups of every dataset; ``teacher_kl/dataset_<k>`` is the k-th dataset's (in the order of ``datasets``).

Offline default: the student SmolLM2-135M-Instruct learns the contact-card task from its ``recipes.sl_basic``
fine-tune (trained first when not there yet, as in ``on_policy_distillation``) while the untrained base model grades
its replies to short instructions (``example-data/preferences`` prompts), which pulls it back towards the base
model's behaviour there: ``teacher_kl/dataset_1`` (0 at the start) shows how far it drifts. The other keys are
those of ``on_policy_distillation``.
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
from tinker_cookbook.distillation.datasets import PROMPT_SETS, DistillationDatasetConfig, TeacherConfig
from tinker_cookbook.eval.evaluators import EvaluatorBuilder
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl import train
from tinker_cookbook.supervised.types import resolve_renderer_name


@chz.chz
class CLIConfig(StudentKeys):
    """Multi-teacher on-policy distillation: the datasets and, per dataset, its teacher and share of the batch."""

    datasets: list[str] = chz.field(default_factory=lambda: ["contact_cards", "instructions"])
    """The prompt sets of the run, in order (``datasets=deepmath,tulu3``)."""
    contact_cards_teacher_model: str | None = None
    """contact_cards' teacher. None with no checkpoint: the default teacher (sl_basic's fine-tune of model_name)."""
    contact_cards_teacher_checkpoint: str | None = None
    """A sampler_weights checkpoint of contact_cards' teacher."""
    contact_cards_groups_per_batch: int = 4
    """contact_cards prompts per batch."""
    instructions_teacher_model: str | None = None
    """instructions' teacher (None: model_name, the untrained base)."""
    instructions_teacher_checkpoint: str | None = None
    """A sampler_weights checkpoint of instructions' teacher."""
    instructions_groups_per_batch: int = 4
    """instructions prompts per batch."""
    deepmath_teacher_model: str | None = None
    """deepmath's teacher (None: model_name)."""
    deepmath_teacher_checkpoint: str | None = None
    """A sampler_weights checkpoint of deepmath's teacher."""
    deepmath_groups_per_batch: int = 512
    """deepmath prompts per batch."""
    tulu3_teacher_model: str | None = None
    """tulu3's teacher (None: model_name)."""
    tulu3_teacher_checkpoint: str | None = None
    """A sampler_weights checkpoint of tulu3's teacher."""
    tulu3_groups_per_batch: int = 512
    """tulu3 prompts per batch."""

    @chz.validate
    def _check(self) -> None:
        unknown = [d for d in self.datasets if d not in PROMPT_SETS]
        if unknown or not self.datasets or len(set(self.datasets)) != len(self.datasets):
            raise ConfigurationError(f"datasets={self.datasets} must name distinct prompt sets of {list(PROMPT_SETS)}")


async def _teacher(cli: CLIConfig, name: str) -> TeacherConfig:
    model, checkpoint = getattr(cli, f"{name}_teacher_model"), getattr(cli, f"{name}_teacher_checkpoint")
    if name == "contact_cards":  # the one dataset with a default fine-tuned teacher
        return await resolve_teacher(cli.model_name, model, checkpoint, cli.progress)
    return TeacherConfig(base_model=model or cli.model_name, load_checkpoint_path=checkpoint)


async def cli_main(cli: CLIConfig) -> None:
    renderer_name = resolve_renderer_name(cli.model_name, cli.renderer_name)
    configs = [DistillationDatasetConfig(
        dataset_builder=prompts(cli, name, getattr(cli, f"{name}_groups_per_batch"), renderer_name),
        teacher_config=await _teacher(cli, name)) for name in cli.datasets]
    scored = "contact_cards" in cli.datasets
    evaluators: list[EvaluatorBuilder] = [offline_teacher.held_out_evaluator()] if scored else []
    await train.main(rl_config(cli, configs, renderer_name, "distillation_multi_teacher", evaluators))
    if scored:
        await report_against_teacher(cli.log_path, configs[cli.datasets.index("contact_cards")].teacher_config)


def main(cli: CLIConfig) -> None:
    asyncio.run(cli_main(cli))


if __name__ == "__main__":
    run_recipe(main, name="distillation_multi_teacher")
