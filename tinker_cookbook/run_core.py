"""What every training loop shares: the run settings, the training client, checkpoints, evaluations, resuming.

The supervised loop (``supervised/train.py``), DPO (``preference/train_dpo.py``) and RL (``rl/train.py``, in its
sync, streaming and async modes; also RLHF's stages, which are these loops) hold only their algorithm; the rest
is here, once:

- ``RunConfig``: the fields of a run (log path, service, model, LoRA rank, renderer, cadence, TTL, wandb, log-dir
  policy), each declared here with one default; a loop's ``Config`` subclasses it, so its command-line keys are
  these top-level names (``log_path=...``, ``save_every=...``). ``EpochRunConfig`` adds what the loops that train
  epochs over a fixed dataset share (supervised, DPO): epochs, the LR schedule and AdamW's settings.
- ``Plan`` (``make_plan``): the steps of a run, where this invocation starts (from the resumed checkpoint) and
  stops, the loop state a checkpoint records, when periodic checkpoints are due and what the last one is called;
  ``EpochBatches`` serves each step's batch in its epoch's order.
- ``resume_point`` + ``open_run`` (``open_epoch_run`` for the epoch loops): the log-dir policy, the resumed
  checkpoint, dropping the ``metrics.jsonl`` rows past it, logging (``ml_log``, wandb) and the training client
  (``create_training_client``, with the renderer check), returned as one ``Run`` that saves the checkpoints.
- ``Evaluators`` + ``run_evaluators``: which evaluators are due at a step, and running them on the current weights.

Checkpoints (``checkpoint_utils`` has the file format): the checkpoint named ``%06d`` of ``s`` holds the state after
``s`` steps; periodic ones are taken when ``s % save_every == 0``, strictly between this invocation's start and
end (the end has its own). The last one is ``final`` (``"final": true``, never expires) when the planned run is
complete, else it is named after its step (``ttl_seconds`` applies) and a rerun with a larger ``max_steps``
continues from it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import shutil
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import chz

from tinker_cookbook import checkpoint_utils, cli_utils, tinker
from tinker_cookbook.eval.evaluators import EvaluatorBuilder, SamplingClientEvaluator, TrainingClientEvaluator
from tinker_cookbook.exceptions import CheckpointError, ConfigurationError, DataError
from tinker_cookbook.supervised.types import SupervisedDataset
from tinker_cookbook.utils import ml_log
from tinker_cookbook.utils.lr_scheduling import LR_SCHEDULES, LRSchedule, compute_schedule_lr_multiplier
from tinker_cookbook.utils.progress import PROGRESS_MODES, ProgressMode, RunProgress, phase

logger = logging.getLogger(__name__)

Evaluator = TrainingClientEvaluator | SamplingClientEvaluator
ConfigT = TypeVar("ConfigT")
ResultT = TypeVar("ResultT")
# The cookbook's AdamW settings besides the learning rate: the defaults of the loops that expose them, and what the
# RL loop always uses.
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.95, 1e-8


def _expand_user(_: object, path: str) -> str:
    return str(Path(path).expanduser())


# ---------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------


@chz.chz
class RunConfig:
    """The settings of a training run that every loop shares; a loop's ``Config`` subclasses it."""

    log_path: str = chz.field(munger=_expand_user)
    """Where the run writes metrics.jsonl, checkpoints.jsonl, config.json and logs.log (``~`` is expanded)."""
    model_name: str
    """The base model the LoRA adapter is trained on."""
    recipe_name: str | None = None
    """Recorded in config.json: which recipe started the run."""
    renderer_name: str | None = None
    """The renderer of the training data; recorded in the run's metadata, and starting or resuming from a checkpoint
    trained with another renderer is refused."""
    load_checkpoint_path: str | None = None
    """Start from these weights (a ``tinker://.../weights/...`` path) with a fresh optimizer; ignored when the log
    dir has a checkpoint to resume."""
    lora_rank: int = 32
    """Rank of the LoRA adapter."""
    seed: int = 0
    """Seed of the LoRA initialisation (a loop that samples also derives its sampling seeds from it, so reruns and
    resumed runs sample the same tokens)."""
    max_steps: int | None = None
    """Stop after this many steps (None: the whole run); rerun with a larger value to go on."""

    evaluator_builders: list[EvaluatorBuilder] = chz.field(default_factory=list)
    """Evaluators run every ``eval_every`` steps and after the last one (besides the loop's own evaluator of the
    dataset's test set, when it has one)."""
    eval_every: int = 10
    """Steps between evaluations (0: never)."""
    save_every: int = 20
    """Steps between checkpoints (0: only at the end); a rerun resumes from the last one."""
    ttl_seconds: int | None = None
    """Expiry of periodic checkpoints (None: kept); the final checkpoint never expires."""

    base_url: str | None = None
    """The service to train on: None, the in-process engine; an http(s) URL, a Tinker-protocol server (such as
    `tinker-cookbook serve`) through the official SDK (`pip install 'tinker==0.38.0'`, the remote extra; key: $TINKER_API_KEY)."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project (None: no wandb)."""
    wandb_name: str | None = None
    """The wandb run name."""
    wandb_entity: str | None = None
    """The wandb entity (team or user) of the project (None: your default entity)."""
    wandb_group: str | None = None
    """Group this run with others in wandb (a sweep, a series of ablations)."""
    wandb_tags: list[str] = chz.field(default_factory=list)
    """Tags of the wandb run (``wandb_tags=a,b``)."""
    progress: ProgressMode = "auto"
    """The console display: ``bar`` (live bar: steps, ETA, phase, throughput), ``lines`` (one plain line per step),
    ``table`` (each step's metrics as a table), ``off``; ``auto``: ``bar`` on a terminal, ``lines`` otherwise."""
    behavior_if_log_dir_exists: cli_utils.LogdirBehavior = "ask"
    """When log_path holds a run: resume it, delete it, raise, or ask (raise when stdin is not a terminal)."""

    @chz.validate
    def _check_run_fields(self) -> None:
        _raise_first([
            (self.max_steps is None or self.max_steps >= 1, f"max_steps={self.max_steps} must be >= 1 (or None)"),
            (self.lora_rank >= 1, f"lora_rank={self.lora_rank} must be at least 1"),
            (min(self.eval_every, self.save_every) >= 0, "eval_every and save_every must be >= 0 (0 disables)"),
            (self.ttl_seconds is None or self.ttl_seconds > 0,
             f"ttl_seconds={self.ttl_seconds} must be a positive number of seconds (or None: kept)"),
            (self.progress in PROGRESS_MODES, f"progress={self.progress!r} must be one of {list(PROGRESS_MODES)}"),
            (self.behavior_if_log_dir_exists in cli_utils.LOGDIR_BEHAVIORS,
             (f"behavior_if_log_dir_exists={self.behavior_if_log_dir_exists!r} must be one of "
              f"{list(cli_utils.LOGDIR_BEHAVIORS)}")),
        ])


@chz.chz
class EpochRunConfig(RunConfig):
    """``RunConfig`` plus what the loops that train epochs over a fixed dataset share (supervised, DPO)."""

    lr_schedule: LRSchedule = "linear"
    """How the learning rate decays over the planned run."""
    lr_warmup_steps: int = 0
    """Steps of linear warm-up before the schedule."""
    num_epochs: int = 1
    """Passes over the training data."""
    adam_beta1: float = ADAM_BETA1
    """AdamW beta1."""
    adam_beta2: float = ADAM_BETA2
    """AdamW beta2."""
    adam_eps: float = ADAM_EPS
    """AdamW epsilon."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip_norm: float = 0.0
    """Clip the gradient to this global norm (0: no clipping)."""

    @chz.validate
    def _check_epoch_fields(self) -> None:
        _raise_first([
            (self.lr_schedule in LR_SCHEDULES, f"lr_schedule={self.lr_schedule!r} must be one of {list(LR_SCHEDULES)}"),
            (self.num_epochs >= 1, f"num_epochs={self.num_epochs} must be at least 1"),
            (self.lr_warmup_steps >= 0, f"lr_warmup_steps={self.lr_warmup_steps} must be >= 0 (0: no warm-up)"),
        ])

    def adam_params(self, learning_rate: float) -> tinker.AdamParams:
        """AdamW's settings for one step at ``learning_rate``."""
        return adam_params(learning_rate, self.adam_beta1, self.adam_beta2, self.adam_eps, self.weight_decay,
                           self.grad_clip_norm)

    def lr_multiplier(self, plan: Plan, step: int) -> float:
        """The schedule's factor at ``step`` of the planned run (its horizon is the whole run, not ``max_steps``)."""
        return compute_schedule_lr_multiplier(self.lr_schedule, step, plan.total_steps, self.lr_warmup_steps)


def adam_params(learning_rate: float, beta1: float = ADAM_BETA1, beta2: float = ADAM_BETA2, eps: float = ADAM_EPS,
                weight_decay: float = 0.0, grad_clip_norm: float = 0.0) -> tinker.AdamParams:
    """One optimizer step's AdamW settings (the RL loop uses the defaults; ``EpochRunConfig`` has them as fields)."""
    return tinker.AdamParams(learning_rate=learning_rate, beta1=beta1, beta2=beta2, eps=eps,
                             weight_decay=weight_decay, grad_clip_norm=grad_clip_norm)


def run_sync(main: Callable[[ConfigT], Coroutine[Any, Any, ResultT]], config: ConfigT) -> ResultT:
    """Run a loop's ``async main(config)`` to the end from synchronous code: ``asyncio.run`` in a plain script, a
    worker thread where an event loop already runs in this thread (Jupyter, IPython), since ``asyncio.run`` cannot
    nest. Each loop's ``run(config)`` is this."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main(config))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="run") as pool:
        return pool.submit(asyncio.run, main(config)).result()


def check_learning_rate(learning_rate: float) -> None:
    """A loop's ``learning_rate`` (each loop has its own default) must be positive and finite."""
    if not (math.isfinite(learning_rate) and learning_rate > 0):
        raise ConfigurationError(f"learning_rate={learning_rate} must be a positive finite number, such as 1e-4")


def _raise_first(checks: list[tuple[bool, str]]) -> None:
    for ok, message in checks:
        if not ok:
            raise ConfigurationError(message)


# ---------------------------------------------------------------------------------------------------------
# Plan: steps, position, checkpoint cadence
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Where a run starts and stops, in steps (step ``s`` trains batch ``s % n_batches`` of epoch ``s // n_batches``)."""

    n_batches: int
    """Batches per epoch."""
    total_steps: int
    """The planned run (the LR schedule's horizon, the denominator of progress)."""
    end_step: int
    """Where this invocation stops: ``total_steps``, or fewer when ``max_steps`` cuts the run short."""
    start_step: int
    """The first step this invocation trains: 0, or the step count of the resumed checkpoint."""

    @property
    def finished(self) -> bool:
        """Whether this invocation reaches the end of the planned run (rather than stopping at max_steps)."""
        return self.end_step >= self.total_steps

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, batch)`` of ``step``."""
        return divmod(step, self.n_batches)

    def loop_state(self, step: int) -> dict[str, int]:
        """What a checkpoint after ``step`` steps records: the step count and the next batch to train."""
        epoch, batch = self.position(step)
        return {"step": step, "epoch": epoch, "batch": batch}

    def checkpoint_due(self, step: int, save_every: int) -> bool:
        """Whether the state after ``step`` steps gets a periodic checkpoint (the end has the last one instead)."""
        return save_every > 0 and self.start_step < step < self.end_step and step % save_every == 0

    def last_checkpoint(self) -> tuple[str, dict[str, Any]]:
        """The name and loop state of the checkpoint taken after the last step of this invocation."""
        if self.finished:
            return "final", {**self.loop_state(self.end_step), "final": True}
        return f"{self.end_step:06d}", self.loop_state(self.end_step)


class EpochBatches:
    """A dataset read step by step: step ``s`` gets batch ``s % n_batches`` in the order of epoch
    ``s // n_batches`` (``set_epoch(seed=epoch)`` once per epoch, so a resumed run sees the same order)."""

    def __init__(self, dataset: SupervisedDataset, plan: Plan) -> None:
        self.dataset = dataset
        self.plan = plan
        self._epoch: int | None = None

    def enter_epoch_of(self, step: int) -> int:
        """Order the dataset for ``step``'s epoch (a no-op when it already is); returns ``step``'s batch index."""
        epoch, batch = self.plan.position(step)
        if epoch != self._epoch:
            self.dataset.set_epoch(seed=epoch)
            self._epoch = epoch
        return batch

    def get(self, step: int) -> list[tinker.Datum]:
        """The datums of ``step``'s batch."""
        return self.dataset.get_batch(self.enter_epoch_of(step))


def make_plan(n_batches: int, num_epochs: int, max_steps: int | None, resume_row: dict[str, Any] | None, *,
              max_steps_plans_run: bool = False) -> Plan:
    """The plan of ``num_epochs`` over ``n_batches`` batches, continuing from ``resume_row`` (None: from step 0).

    ``max_steps`` stops this invocation early without changing the plan, so that a rerun with a larger one trains
    exactly like an uninterrupted run (the supervised loops' LR schedule spans the plan); with
    ``max_steps_plans_run`` it is the planned length itself (RL: a constant LR, and the run is as long as asked).
    """
    if n_batches <= 0:
        raise DataError("the training dataset has no full batch; lower batch_size or add data")
    total = n_batches * num_epochs
    end = total if max_steps is None else min(total, max_steps)
    if max_steps_plans_run:
        total = end
    return Plan(n_batches=n_batches, total_steps=total, end_step=end, start_step=resumed_step(resume_row, n_batches))


def resumed_step(row: dict[str, Any] | None, n_batches: int) -> int:
    """The step count of a checkpoint row (0 for None), checked against the current number of batches per epoch."""
    if row is None:
        return 0
    if "epoch" not in row and "step" not in row and "batch" in row:
        return _int_field(row, "batch")  # rows of single-pass runs once recorded only the steps done, as "batch"
    epoch, batch = _int_field(row, "epoch"), _int_field(row, "batch")
    step = epoch * n_batches + batch
    if "step" in row and _int_field(row, "step") != step:
        raise CheckpointError(
            f"checkpoint {row.get('name')!r} was saved after step {row['step']} (epoch {epoch}, batch {batch}) with a "
            f"different number of batches per epoch than now ({n_batches}); the dataset or batch size changed, so "
            "the run cannot be resumed exactly. Use another log_path or behavior_if_log_dir_exists=delete"
        )
    return step


def _int_field(row: dict[str, Any], key: str) -> int:
    try:
        return int(row[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint row {row} has no valid {key!r} to resume from") from exc


# ---------------------------------------------------------------------------------------------------------
# Opening a run: log-dir policy, resume, logging, training client
# ---------------------------------------------------------------------------------------------------------


def resume_point(config: RunConfig) -> checkpoint_utils.ResumePoint:
    """Apply the log-dir policy to ``config.log_path`` and find the checkpoint this run continues from.

    A kept run must have been started with the same model, data and adapter shape (else ``ConfigurationError``).
    Call it before building the datasets and before anything writes to the log dir.
    """
    return checkpoint_utils.resume_point(config.log_path, config.behavior_if_log_dir_exists, config)


async def create_training_client(service_client: tinker.ServiceClient, config: RunConfig,
                                 resume_row: dict[str, Any] | None) -> tinker.TrainingClient:
    """The training client: resumed from ``resume_row`` (weights and optimizer), started from
    ``load_checkpoint_path`` (weights only), or a fresh LoRA adapter. Either checkpoint must have been trained with
    ``renderer_name`` (when both are known); the client records it in its metadata for later tools."""
    metadata = checkpoint_utils.renderer_user_metadata(config.renderer_name)
    if resume_row is not None:
        checkpoint_utils.check_renderer_name_for_checkpoint(service_client, resume_row["state_path"],
                                                            config.renderer_name)
        logger.info("resuming from checkpoint %s (%s)", resume_row.get("name"), resume_row["state_path"])
        return await service_client.create_training_client_from_state_with_optimizer_async(
            resume_row["state_path"], user_metadata=metadata)
    if config.load_checkpoint_path is not None:
        checkpoint_utils.check_renderer_name_for_checkpoint(service_client, config.load_checkpoint_path,
                                                            config.renderer_name)
        logger.info("starting from the weights of %s (fresh optimizer)", config.load_checkpoint_path)
        return await service_client.create_training_client_from_state_async(config.load_checkpoint_path,
                                                                            user_metadata=metadata)
    return await service_client.create_lora_training_client_async(
        base_model=config.model_name, rank=config.lora_rank, seed=config.seed, user_metadata=metadata)


@dataclass
class Run:
    """An open run: its plan, its metrics logger and its clients. ``with run:`` ends the logging on the way out."""

    config: RunConfig
    plan: Plan
    ml_logger: ml_log.Logger
    service_client: tinker.ServiceClient
    training_client: tinker.TrainingClient

    def phase(self, name: str) -> Any:
        """``with run.phase("sampling"):`` shows the phase on the run's progress display while the block runs."""
        return phase(name)

    def start_checkpoint_if_due(self, step: int) -> checkpoint_utils.PendingCheckpoint | None:
        """Queue the periodic checkpoint of the state after ``step`` steps when one is due (call it when everything
        queued so far ends with step ``step - 1``'s ``optim_step``); record it with ``finish_async``."""
        if not self.plan.checkpoint_due(step, self.config.save_every):
            return None
        return checkpoint_utils.start_checkpoint(self.training_client, f"{step:06d}", self.config.log_path,
                                                 self.plan.loop_state(step), "both", self.config.ttl_seconds)

    def start_last_checkpoint(self) -> checkpoint_utils.PendingCheckpoint:
        """Queue the checkpoint after this invocation's last step: ``final`` (kept) or named after its step."""
        name, loop_state = self.plan.last_checkpoint()
        ttl = None if self.plan.finished else self.config.ttl_seconds
        return checkpoint_utils.start_checkpoint(self.training_client, name, self.config.log_path, loop_state,
                                                 "both", ttl)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.ml_logger.close()


async def open_run(config: RunConfig, plan: Plan, resume: checkpoint_utils.ResumePoint) -> Run | None:
    """Get the log dir ready for ``plan`` (dropping the metrics rows past the resumed checkpoint), start logging
    and create the training client; None when the run already reached ``plan.end_step`` (nothing to do)."""
    if not resume.begin(plan.start_step, plan.end_step):
        return None
    log_dir = Path(config.log_path)
    held_a_run = log_dir.is_dir() and any(log_dir.iterdir())
    progress = RunProgress(config.progress, plan.start_step, plan.end_step, plan.total_steps,
                           name=config.recipe_name or Path(config.log_path).name)
    ml_logger = ml_log.setup_logging(
        config.log_path, config.wandb_project, config.wandb_name, config=config, print_metrics=False,
        wandb_entity=config.wandb_entity, wandb_group=config.wandb_group, wandb_tags=config.wandb_tags,
        extra_sinks=[progress])
    progress.open()
    progress.set_phase("training")
    try:
        service_client = tinker.ServiceClient(base_url=config.base_url)
        training_client = await create_training_client(service_client, config, resume.row)
    except BaseException:
        ml_logger.close()
        if not held_a_run:
            # Nothing was trained: leave no stub run (config.json, logs.log) that the next attempt would have to
            # resume or delete.
            shutil.rmtree(log_dir, ignore_errors=True)
        raise
    return Run(config, plan, ml_logger, service_client, training_client)


async def open_epoch_run(
    config: EpochRunConfig, build_datasets: Callable[[], tuple[SupervisedDataset, SupervisedDataset | None]]
) -> tuple[Run, SupervisedDataset, SupervisedDataset | None] | None:
    """The start of a loop that trains epochs over a fixed dataset: the log-dir policy and resume point, the
    datasets, the plan of ``num_epochs`` over them (cut at ``max_steps``) and the open run with its train and test
    datasets; None when the run already reached its end."""
    resume = resume_point(config)
    train_dataset, test_dataset = build_datasets()
    plan = make_plan(len(train_dataset), config.num_epochs, config.max_steps, resume.row)
    run = await open_run(config, plan, resume)
    if run is None:
        return None
    logger.info("training %s: %d batches/epoch x %d epochs = %d steps; this run: steps %d..%d", config.model_name,
                plan.n_batches, config.num_epochs, plan.total_steps, plan.start_step, plan.end_step - 1)
    return run, train_dataset, test_dataset


# ---------------------------------------------------------------------------------------------------------
# Evaluations
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Evaluators:
    """The evaluators of a run, each with how often it runs (in steps; 0: never)."""

    log_path: str | None = None
    """The run's directory, handed to each evaluator (``attach_to_run``) for the files it writes (Inspect logs)."""
    every: list[tuple[int, Evaluator]] = field(default_factory=list)

    def add(self, period: int, evaluators: Sequence[Evaluator]) -> None:
        for evaluator in evaluators:
            attach = getattr(evaluator, "attach_to_run", None)  # evaluators not built on the base classes lack it
            if self.log_path is not None and attach is not None:
                attach(self.log_path)
            self.every.append((period, evaluator))

    def due(self, step: int, final: bool = False) -> list[Evaluator]:
        """Those due before ``step`` (``step % period == 0``), or all with a period when ``final``."""
        return [ev for period, ev in self.every if period > 0 and (final or step % period == 0)]

    def before_step(self, plan: Plan, step: int) -> list[Evaluator]:
        """Those due before ``step``, except before the last step of a finished run: that one's row gets the final
        model's evaluations instead (``after_run``), so the last row shows where training ended."""
        return [] if plan.finished and step == plan.end_step - 1 else self.due(step)

    def after_run(self, plan: Plan) -> list[Evaluator]:
        """Those to run on the final model: all with a period when the planned run is complete, else none (a run
        stopped by max_steps is evaluated when it is finished)."""
        return self.due(plan.end_step, final=True) if plan.finished else []


async def run_evaluators(evaluators: list[Evaluator], training_client: tinker.TrainingClient,
                         sampling_client: tinker.SamplingClient | None = None) -> dict[str, float]:
    """Run ``evaluators`` on the current weights (after every request queued so far); sampling evaluators get
    ``sampling_client``, or one snapshot of the training client's weights made for them."""
    metrics: dict[str, float] = {}
    if not evaluators:
        return metrics
    with phase("evaluating"):
        for evaluator in evaluators:
            if isinstance(evaluator, SamplingClientEvaluator):
                if sampling_client is None:
                    sampling_client = await training_client.save_weights_and_get_sampling_client_async()
                metrics.update(await evaluator(sampling_client))
            else:
                metrics.update(await evaluator(training_client))
    return metrics
