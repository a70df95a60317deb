"""Off-policy distillation: the teacher writes replies to prompts, then the student is fine-tuned on them (SFT).

    python -m recipes.distillation.off_policy_reasoning            # offline: SmolLM2 student, fine-tuned teacher
    python -m recipes.distillation.off_policy_reasoning model_name=tinker-cookbook/tiny-smollm2 \\
        teacher_model=tinker-cookbook/tiny-smollm2 keep_truncated=true max_steps=1 eval_every=0   # smoke test
    python -m tinker_cookbook.recipes.distillation.off_policy_reasoning model_name=Qwen/Qwen3-8B-Base \\
        teacher_model=Qwen/Qwen3-8B dataset=deepmath teacher_max_tokens=16384 max_length=16384 \\
        learning_rate=1e-4 batch_size=128 lora_rank=128                          # where the models and hub exist

Step 1 (``tinker_cookbook.distillation.teacher_data``): the teacher samples ``samples_per_prompt`` replies to each
prompt of ``dataset`` and they are appended to ``data_file`` (a JSONL of conversations). A rerun resumes: prompts
already there are skipped, so the traces are written once and reused; a file of another teacher is refused.
Step 2: the shared supervised loop fine-tunes the student on that file (``FromConversationFileBuilder``).

Offline default: the teacher is ``recipes.sl_basic``'s contact-card fine-tune of SmolLM2-135M-Instruct (trained
first when no ``teacher_model``/``teacher_checkpoint`` is given; see ``recipes/distillation/teacher.py``); it writes
a card for each of the task's 272 training prompts (greedy), and the base model is fine-tuned on those cards for
one epoch. The held-out contact-card score is logged every ``eval_every`` steps and printed next to the teacher's.
The official recipe fine-tunes on OpenThoughts3's reasoning traces, which another teacher wrote; here the traces
are written by the teacher you name, so the recipe runs offline.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import chz

from recipes.distillation import teacher as offline_teacher
from recipes.distillation.student import report_against_teacher, resolve_teacher
from tinker_cookbook import hyperparam_utils, renderers, tinker
from tinker_cookbook.cli_utils import LogdirBehavior, run_recipe
from tinker_cookbook.distillation.datasets import load_prompts
from tinker_cookbook.distillation.teacher_data import write_teacher_data
from tinker_cookbook.eval.evaluators import EvaluatorBuilder
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig, resolve_renderer_name
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.utils.lr_scheduling import LRSchedule
from tinker_cookbook.utils.progress import ProgressMode

logger = logging.getLogger(__name__)


@chz.chz
class CLIConfig:
    """Teacher-written data, then SFT of the student on it (the official recipe's keys, plus the teacher's)."""

    model_name: str = offline_teacher.DEFAULT_MODEL
    """The student."""
    lora_rank: int = 32
    """Rank of the student's LoRA adapter."""
    renderer_name: str | None = None
    """None: the student's recommended renderer (also used to prompt the teacher)."""
    load_checkpoint_path: str | None = None
    """Start the student from these weights."""
    teacher_model: str | None = None
    """The teacher's base model. None with no ``teacher_checkpoint``: the default contact-card teacher."""
    teacher_checkpoint: str | None = None
    """A ``sampler_weights`` checkpoint of the teacher (of ``teacher_model``, or of ``model_name`` when unset)."""
    dataset: str = "contact_cards"
    """The prompts the teacher answers: contact_cards, instructions (offline), deepmath, tulu3 (hub)."""
    data_file: str | None = None
    """Where the teacher's replies are stored (None: ``<tmp>/tinker-datasets/distillation/<dataset>_teacher.jsonl``)."""
    max_prompts: int | None = None
    """Answer only the first this many prompts (None: all)."""
    samples_per_prompt: int = 1
    """Teacher replies per prompt."""
    teacher_temperature: float = 0.0
    """The teacher's sampling temperature (0: greedy)."""
    teacher_max_tokens: int = 64
    """The most tokens per teacher reply; longer replies are dropped (see ``keep_truncated``)."""
    keep_truncated: bool = False
    """Keep the replies that reached ``teacher_max_tokens`` before their end, cut there (False: drop them)."""
    batch_size: int = 16
    """Conversations per SFT step."""
    learning_rate: float | None = None
    """None: the student's recommended LoRA learning rate (``hyperparam_utils.get_lr``)."""
    lr_schedule: LRSchedule = "linear"
    """The learning-rate schedule over the run."""
    num_epochs: int = 1
    """Passes over the teacher's data."""
    max_length: int = 256
    """Conversations are cut to this many tokens."""
    log_path: str = chz.field(munger=lambda _, s: str(Path(s).expanduser()))
    """The SFT run's directory."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project."""
    wandb_name: str | None = None
    """The wandb run name."""
    eval_every: int = 6
    """Steps between held-out evaluations (0: never)."""
    save_every: int = 20
    """Steps between checkpoints (0: only the final one)."""
    base_url: str | None = None
    """None: the in-process engine; else a Tinker-protocol server."""
    behavior_if_log_dir_exists: LogdirBehavior = "ask"
    """When log_path holds a run: resume, delete, raise or ask."""
    max_steps: int | None = None
    """Stop the SFT after this many steps (None: all epochs)."""
    progress: ProgressMode = "auto"
    """The console display: bar, lines, table, off or auto."""


def default_data_file(dataset: str) -> str:
    return str(Path("/tmp/tinker-datasets/distillation") / f"{dataset}_teacher.jsonl")


async def cli_main(cli: CLIConfig) -> None:
    renderer_name = resolve_renderer_name(cli.model_name, cli.renderer_name)
    teacher = await resolve_teacher(cli.model_name, cli.teacher_model, cli.teacher_checkpoint, cli.progress)
    data_file = cli.data_file or default_data_file(cli.dataset)
    renderer = renderers.get_renderer(renderer_name, get_tokenizer(cli.model_name), model_name=cli.model_name)
    service = tinker.ServiceClient(base_url=cli.base_url)
    stats = await write_teacher_data(
        data_file, load_prompts(cli.dataset)[: cli.max_prompts], teacher, renderer, service,
        samples_per_prompt=cli.samples_per_prompt, max_tokens=cli.teacher_max_tokens,
        temperature=cli.teacher_temperature, keep_truncated=cli.keep_truncated)
    print(f"teacher data {data_file}: {stats.prompts} prompts, {stats.skipped} already there, "
          f"{stats.rows_written} replies written, {stats.truncated} dropped for reaching teacher_max_tokens")
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=cli.model_name, renderer_name=renderer_name,
                                            max_length=cli.max_length, batch_size=cli.batch_size)
    scored = cli.dataset == "contact_cards"
    evaluators: list[EvaluatorBuilder] = [offline_teacher.held_out_evaluator()] if scored else []
    config = train.Config(
        log_path=cli.log_path, model_name=cli.model_name, recipe_name="distillation_off_policy",
        renderer_name=renderer_name, load_checkpoint_path=cli.load_checkpoint_path, lora_rank=cli.lora_rank,
        max_steps=cli.max_steps, evaluator_builders=evaluators, eval_every=cli.eval_every,
        save_every=cli.save_every, base_url=cli.base_url, wandb_project=cli.wandb_project,
        wandb_name=cli.wandb_name, progress=cli.progress, behavior_if_log_dir_exists=cli.behavior_if_log_dir_exists,
        learning_rate=cli.learning_rate or hyperparam_utils.get_lr(cli.model_name), lr_schedule=cli.lr_schedule,
        num_epochs=cli.num_epochs,
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=data_file))
    await train.main(config)
    if scored:
        await report_against_teacher(cli.log_path, teacher)


def main(cli: CLIConfig) -> None:
    asyncio.run(cli_main(cli))


if __name__ == "__main__":
    run_recipe(main, name="distillation_off_policy")
