"""The supervised fine-tuning loop: ``Config`` + ``main``.

    python -m tinker_cookbook.supervised.train model_name=... log_path=... dataset_builder=...

Recipes build a ``Config`` (``recipes/sl_basic.py``); ``recipes/sl_loop.py`` is the same algorithm as a flat,
self-contained script on the raw API, for reading.

Each step trains one batch: ``forward_backward`` with the ``cross_entropy`` loss, then ``optim_step`` (AdamW) at
``learning_rate * schedule(step)``. Steps are pipelined: step ``s + 1`` is queued before the results of step
``s`` are awaited, so the engine is never idle while the loop does its bookkeeping.

Steps, epochs and checkpoints (see ``checkpoint_utils`` for the file format):

- Step ``s`` (0-based) trains batch ``s % n_batches`` of epoch ``s // n_batches``; the planned run is
  ``n_batches * num_epochs`` steps and the LR schedule spans all of it. ``max_steps`` stops the run early without
  changing the schedule, so a run cut off by ``max_steps`` and resumed with a larger one trains exactly like an
  uninterrupted run.
- Evaluators see the weights *before* the step whose row they are logged in (row 0 = the initial model),
  except in the last row of a finished run, where they see the final model (they run after the last step).
  So ``df["test/nll"].dropna()`` goes from the base model to the trained one, and the last row has both
  ``train_mean_nll`` and ``test/nll``. A run stopped by ``max_steps`` is not finished: it has no final
  evaluation, so that resuming it gives exactly the rows of an uninterrupted run.
- A checkpoint named ``%06d`` of ``s`` holds the state after ``s`` steps and is queued right after step
  ``s - 1``'s ``optim_step``, before step ``s`` is queued. Its row is written once the save has completed.
  The run ends with a checkpoint named ``final`` (``"final": true``) or, when stopped by ``max_steps``, one
  named after its step.
- Resuming (``behavior_if_log_dir_exists=resume``, or answering "resume"; ``checkpoint_utils.resume_point``, shared
  with the RL loop) loads the last row with a ``state_path`` with its optimizer state, drops ``metrics.jsonl`` rows
  from that step on (they are recomputed), and continues from that row's (epoch, batch). A finished run is left
  alone; a log dir that holds a run of another model or dataset is refused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import chz

from tinker_cookbook import checkpoint_utils, cli_utils, tinker
from tinker_cookbook.eval.evaluators import EvaluatorBuilder, SamplingClientEvaluator, TrainingClientEvaluator
from tinker_cookbook.exceptions import CheckpointError, DataError
from tinker_cookbook.supervised.common import compute_mean_nll, count_loss_tokens
from tinker_cookbook.supervised.nll_evaluator import NLLEvaluator
from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder
from tinker_cookbook.tinker import types
from tinker_cookbook.utils import ml_log
from tinker_cookbook.utils.lr_scheduling import LR_SCHEDULES, LRSchedule, compute_schedule_lr_multiplier
from tinker_cookbook.utils.misc_utils import timed

logger = logging.getLogger(__name__)


@chz.chz
class RunConfig:
    """The settings every loop that trains one LoRA adapter on batches of data shares (supervised, DPO).

    A loop's ``Config`` subclasses it and adds its dataset builder and its own knobs, so each of these fields has
    one definition, one docstring and one check.
    """

    log_path: str
    """Where the run writes metrics.jsonl, checkpoints.jsonl, config.json and logs.log."""
    model_name: str
    """The base model the LoRA adapter is trained on."""
    recipe_name: str | None = None
    """Recorded in config.json: which recipe started the run."""
    load_checkpoint_path: str | None = None
    """Start from these weights (a ``tinker://.../weights/...`` path) with a fresh optimizer."""
    renderer_name: str | None = None
    """Recorded in the run's metadata so that later tools render prompts the same way."""

    learning_rate: float = 1e-4
    """Peak learning rate of AdamW (``hyperparam_utils.get_lr`` suggests one per model)."""
    lr_schedule: LRSchedule = "linear"
    """How the learning rate decays over the planned run."""
    lr_warmup_steps: int = 0
    """Steps of linear warm-up before the schedule."""
    num_epochs: int = 1
    """Passes over the training data."""
    max_steps: int | None = None
    """Stop after this many steps without changing the schedule (None: the whole run); rerun with more to go on."""
    lora_rank: int = 32
    """Rank of the LoRA adapter."""
    seed: int = 0
    """Seed of the LoRA initialisation."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip_norm: float = 0.0
    """Clip the gradient to this global norm (0: no clipping)."""

    evaluator_builders: list[EvaluatorBuilder] = chz.field(default_factory=list)
    """Evaluators run every ``eval_every`` steps."""
    eval_every: int = 10
    """Steps between evaluations (0: never)."""
    save_every: int = 20
    """Steps between checkpoints (0: only at the end); a rerun resumes from the last one."""
    ttl_seconds: int | None = None
    """Expiry of periodic checkpoints (None: kept); the final checkpoint never expires."""

    base_url: str | None = None
    """The service to train on: None, the in-process engine; an http(s) URL, a Tinker-protocol server (such as
    `tinker-cookbook serve`) through the official SDK (`pip install tinker_cookbook[remote]`; key: $TINKER_API_KEY)."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project (None: no wandb)."""
    wandb_name: str | None = None
    """The wandb run name."""
    behavior_if_log_dir_exists: cli_utils.LogdirBehavior = "ask"
    """When log_path holds a run: resume it, delete it, raise, or ask (raise when stdin is not a terminal)."""

    @chz.validate
    def _check_run(self) -> None:
        checks = [
            (math.isfinite(self.learning_rate) and self.learning_rate > 0,
             f"learning_rate={self.learning_rate} must be a positive finite number, such as 1e-4"),
            (self.lr_schedule in LR_SCHEDULES, f"lr_schedule={self.lr_schedule!r} must be one of {list(LR_SCHEDULES)}"),
            (self.num_epochs >= 1, f"num_epochs={self.num_epochs} must be at least 1"),
            (self.max_steps is None or self.max_steps >= 1, f"max_steps={self.max_steps} must be >= 1 (or None)"),
            (self.lora_rank >= 1, f"lora_rank={self.lora_rank} must be at least 1"),
            (min(self.eval_every, self.save_every, self.lr_warmup_steps) >= 0,
             "eval_every, save_every and lr_warmup_steps must be >= 0 (0 disables)"),
            (self.behavior_if_log_dir_exists in cli_utils.LOGDIR_BEHAVIORS,
             (f"behavior_if_log_dir_exists={self.behavior_if_log_dir_exists!r} must be one of "
              f"{list(cli_utils.LOGDIR_BEHAVIORS)}")),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@chz.chz
class Config(RunConfig):
    """Supervised fine-tuning of a LoRA adapter."""

    dataset_builder: SupervisedDatasetBuilder
    """Builds the train (and optional test) dataset."""
    evaluator_builders: list[EvaluatorBuilder] = chz.field(default_factory=list)
    """Evaluators run every ``eval_every`` steps (the test set's NLL is always one when there is a test set)."""
    infrequent_evaluator_builders: list[EvaluatorBuilder] = chz.field(default_factory=list)
    """Evaluators run every ``infrequent_eval_every`` steps."""
    infrequent_eval_every: int = 100
    """Steps between infrequent evaluations (0: never)."""
    num_examples_to_show: int = 1
    """Training datums printed at the start, trained tokens highlighted."""

    @chz.validate
    def _check(self) -> None:
        if self.infrequent_eval_every < 0:
            raise ValueError(f"infrequent_eval_every={self.infrequent_eval_every} must be >= 0 (0 disables)")


# ---------------------------------------------------------------------------------------------------------
# Plan and resume position
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Where a run starts and stops, in steps."""

    n_batches: int
    total_steps: int
    """The planned run: ``n_batches * num_epochs`` (the LR schedule's horizon, the denominator of progress)."""
    end_step: int
    """Where this invocation stops: ``min(total_steps, max_steps)``."""
    start_step: int

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


def _start_step(row: dict[str, Any] | None, n_batches: int) -> int:
    if row is None:
        return 0
    try:
        epoch, batch = int(row["epoch"]), int(row["batch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint row {row} has no valid epoch/batch to resume from") from exc
    step = epoch * n_batches + batch
    if "step" in row and int(row["step"]) != step:
        raise CheckpointError(
            f"checkpoint {row.get('name')!r} was saved after step {row['step']} (epoch {epoch}, batch {batch}) with a "
            f"different number of batches per epoch than now ({n_batches}); the dataset or batch size changed, so "
            "the run cannot be resumed exactly. Use another log_path or behavior_if_log_dir_exists=delete"
        )
    return step


def make_plan(config: Config, n_batches: int, resume_row: dict[str, Any] | None) -> Plan:
    if n_batches <= 0:
        raise DataError("the training dataset has no full batch; lower batch_size or add data")
    total = n_batches * config.num_epochs
    end = total if config.max_steps is None else min(total, config.max_steps)
    return Plan(n_batches=n_batches, total_steps=total, end_step=end, start_step=_start_step(resume_row, n_batches))


# ---------------------------------------------------------------------------------------------------------
# Setup helpers
# ---------------------------------------------------------------------------------------------------------


def _create_training_client(
    service_client: tinker.ServiceClient, config: Config, resume_row: dict[str, Any] | None
) -> tinker.TrainingClient:
    metadata = checkpoint_utils.renderer_user_metadata(config.renderer_name)
    if resume_row is not None:
        logger.info("resuming from checkpoint %s (%s)", resume_row["name"], resume_row["state_path"])
        return service_client.create_training_client_from_state_with_optimizer(
            resume_row["state_path"], user_metadata=metadata
        )
    if config.load_checkpoint_path is not None:
        checkpoint_utils.check_renderer_name_for_checkpoint(
            service_client, config.load_checkpoint_path, config.renderer_name
        )
        logger.info("starting from the weights of %s (fresh optimizer)", config.load_checkpoint_path)
        return service_client.create_training_client_from_state(config.load_checkpoint_path, user_metadata=metadata)
    return service_client.create_lora_training_client(
        base_model=config.model_name, rank=config.lora_rank, seed=config.seed, user_metadata=metadata
    )


@dataclass
class Evaluators:
    """The evaluators of a run, each with how often it runs."""

    every: list[tuple[int, TrainingClientEvaluator | SamplingClientEvaluator]] = field(default_factory=list)

    def due(self, step: int, final: bool) -> list[TrainingClientEvaluator | SamplingClientEvaluator]:
        return [ev for period, ev in self.every if period > 0 and (final or step % period == 0)]


def _build_evaluators(config: Config, test_dataset: SupervisedDataset | None) -> Evaluators:
    evaluators = Evaluators()
    if test_dataset is not None:
        evaluators.every.append((config.eval_every, NLLEvaluator.from_dataset(test_dataset, name="test")))
    evaluators.every.extend((config.eval_every, builder()) for builder in config.evaluator_builders)
    evaluators.every.extend((config.infrequent_eval_every, b()) for b in config.infrequent_evaluator_builders)
    return evaluators


async def run_evaluators(
    evaluators: list[TrainingClientEvaluator | SamplingClientEvaluator], training_client: tinker.TrainingClient
) -> dict[str, float]:
    """Run ``evaluators`` on the current weights (after every request queued so far)."""
    metrics: dict[str, float] = {}
    sampling_client = None
    for evaluator in evaluators:
        if isinstance(evaluator, SamplingClientEvaluator):
            if sampling_client is None:
                sampling_client = await training_client.save_weights_and_get_sampling_client_async()
            metrics.update(await evaluator(sampling_client))
        else:
            metrics.update(await evaluator(training_client))
    return metrics


def _show_examples(dataset: SupervisedDataset, training_client: tinker.TrainingClient, count: int,
                   ml_logger: ml_log.Logger) -> None:
    """Print the first ``count`` training datums, trained tokens highlighted (also saved to the log dir)."""
    if count <= 0:
        return
    tokenizer = training_client.get_tokenizer()
    for datum in dataset.get_batch(0)[:count]:
        try:
            from tinker_cookbook.display import colorize_example

            text = colorize_example(datum, tokenizer)
        except ImportError:  # display helpers are optional here: fall back to plain text
            text = _plain_example(datum, tokenizer)
        print(text)
        ml_logger.log_long_text("example", _plain_example(datum, tokenizer))


def _plain_example(datum: types.Datum, tokenizer: Any) -> str:
    """The datum as text: what the model only reads, then what it is trained to write."""
    first = [t for c in datum.model_input.chunks if isinstance(c, types.EncodedTextChunk) for t in c.tokens][:1]
    targets = datum.loss_fn_inputs["target_tokens"].tolist()
    weights = datum.loss_fn_inputs["weights"].tolist()
    context = first + [t for t, w in zip(targets, weights, strict=True) if w == 0]
    trained = [t for t, w in zip(targets, weights, strict=True) if w != 0]
    return f"--- context (weight 0) ---\n{tokenizer.decode(context)}\n--- trained (weight > 0) ---\n" \
           f"{tokenizer.decode(trained)}"


# ---------------------------------------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------------------------------------


@dataclass
class SubmittedStep:
    """A step whose requests are queued; ``metrics`` collects what is known before its results arrive."""

    step: int
    data: list[types.Datum]
    fwd_bwd: tinker.APIFuture[types.ForwardBackwardOutput]
    optim: tinker.APIFuture[types.OptimStepResponse]
    metrics: dict[str, Any]


def adam_params(config: Config, learning_rate: float) -> types.AdamParams:
    return types.AdamParams(
        learning_rate=learning_rate, beta1=config.adam_beta1, beta2=config.adam_beta2, eps=config.adam_eps,
        weight_decay=config.weight_decay, grad_clip_norm=config.grad_clip_norm,
    )


async def submit_step(
    training_client: tinker.TrainingClient, config: Config, plan: Plan, step: int, data: list[types.Datum]
) -> SubmittedStep:
    """Queue ``forward_backward`` and ``optim_step`` of ``step`` (back to back: the same engine turn)."""
    multiplier = compute_schedule_lr_multiplier(config.lr_schedule, step, plan.total_steps, config.lr_warmup_steps)
    lr = config.learning_rate * multiplier
    fwd_bwd = await training_client.forward_backward_async(data, "cross_entropy")
    optim = await training_client.optim_step_async(adam_params(config, lr))
    epoch, _ = plan.position(step)
    metrics: dict[str, Any] = {
        "epoch": epoch,
        "progress": (step + 1) / plan.total_steps,
        "learning_rate": lr,
        "num_sequences": len(data),
        "num_tokens": sum(d.model_input.length for d in data),
        "num_loss_tokens": count_loss_tokens(data),
    }
    return SubmittedStep(step=step, data=data, fwd_bwd=fwd_bwd, optim=optim, metrics=metrics)


async def finish_step(submitted: SubmittedStep) -> dict[str, Any]:
    """Wait for a step's results and return its metrics row."""
    metrics = submitted.metrics
    with timed("wait_results", metrics):
        output = await submitted.fwd_bwd.result_async()
        optim = await submitted.optim.result_async()
    logprobs = [out["logprobs"] for out in output.loss_fn_outputs]
    weights = [d.loss_fn_inputs["weights"] for d in submitted.data]
    metrics["train_mean_nll"] = compute_mean_nll(logprobs, weights)
    metrics.update({f"optim/{k}": v for k, v in (optim.metrics or {}).items()})
    return metrics


# ---------------------------------------------------------------------------------------------------------
# Main loop
# ---------------------------------------------------------------------------------------------------------


def _final_checkpoint_name(plan: Plan) -> tuple[str, bool]:
    return ("final" if plan.finished else f"{plan.end_step:06d}"), plan.finished


async def _train(
    config: Config, plan: Plan, training_client: tinker.TrainingClient, train_dataset: SupervisedDataset,
    evaluators: Evaluators, ml_logger: ml_log.Logger,
) -> None:
    previous: SubmittedStep | None = None
    pending_save: checkpoint_utils.PendingCheckpoint | None = None
    last_row_time = time.perf_counter()
    current_epoch = -1
    for step in range(plan.start_step, plan.end_step):
        epoch, batch = plan.position(step)
        timings: dict[str, float] = {}
        # Everything queued so far ends with step - 1's optim_step: saves and evals here see exactly the
        # weights after `step` steps.
        if config.save_every > 0 and step > plan.start_step and step % config.save_every == 0:
            pending_save = checkpoint_utils.start_checkpoint(
                training_client, f"{step:06d}", config.log_path, plan.loop_state(step), "both", config.ttl_seconds
            )
        # The last step of a finished run is evaluated after it instead (by _finish_run), on the final model.
        due = [] if plan.finished and step == plan.end_step - 1 else evaluators.due(step, final=False)
        with timed("evals", timings):
            eval_metrics = await run_evaluators(due, training_client)
        if epoch != current_epoch:
            train_dataset.set_epoch(seed=epoch)
            current_epoch = epoch
        with timed("get_batch", timings):
            data = train_dataset.get_batch(batch)
        submitted = await submit_step(training_client, config, plan, step, data)
        submitted.metrics.update(eval_metrics)
        submitted.metrics.update(timings)
        if previous is not None:
            last_row_time = await _log_step(previous, ml_logger, last_row_time)
        if pending_save is not None:
            await pending_save.finish_async()
            pending_save = None
        previous = submitted
    assert previous is not None, f"no step between {plan.start_step} and {plan.end_step}"
    await _finish_run(config, plan, training_client, evaluators, ml_logger, previous, last_row_time)


async def _log_step(
    submitted: SubmittedStep, ml_logger: ml_log.Logger, last_row_time: float, extra: dict[str, Any] | None = None
) -> float:
    metrics = await finish_step(submitted)
    metrics.update(extra or {})
    now = time.perf_counter()
    metrics["time/total"] = now - last_row_time
    metrics["perf/tokens_per_s"] = metrics["num_tokens"] / max(metrics["time/total"], 1e-9)
    ml_logger.log_metrics(metrics, step=submitted.step)
    return now


async def _finish_run(
    config: Config, plan: Plan, training_client: tinker.TrainingClient, evaluators: Evaluators,
    ml_logger: ml_log.Logger, last: SubmittedStep, last_row_time: float,
) -> None:
    """The last step's row (with the final model's evaluations when the run is finished) and the last checkpoint."""
    name, finished = _final_checkpoint_name(plan)
    loop_state = {**plan.loop_state(plan.end_step), **({"final": True} if finished else {})}
    pending = checkpoint_utils.start_checkpoint(
        training_client, name, config.log_path, loop_state, "both", None if finished else config.ttl_seconds
    )
    final_metrics: dict[str, Any] = {}
    if finished:
        with timed("evals", final_metrics):
            final_metrics.update(await run_evaluators(evaluators.due(plan.end_step, final=True), training_client))
    await _log_step(last, ml_logger, last_row_time, final_metrics)
    row = await pending.finish_async()
    what = "finished" if finished else f"stopped at max_steps={config.max_steps}"
    logger.info("training %s after %d steps; last checkpoint %s", what, plan.end_step, row.get("state_path"))


async def main(config: Config) -> None:
    """Train per ``config``; see the module docstring for steps, checkpoints and resuming."""
    resume = checkpoint_utils.resume_point(config.log_path, config.behavior_if_log_dir_exists, config)
    resume_row = resume.row
    train_dataset, test_dataset = config.dataset_builder()
    plan = make_plan(config, len(train_dataset), resume_row)
    if not resume.begin(plan.start_step, plan.end_step):
        return
    ml_logger = ml_log.setup_logging(config.log_path, config.wandb_project, config.wandb_name, config=config)
    try:
        service_client = tinker.ServiceClient(base_url=config.base_url)
        training_client = _create_training_client(service_client, config, resume_row)
        logger.info(
            "training %s: %d batches/epoch x %d epochs = %d steps; this run: steps %d..%d",
            config.model_name, plan.n_batches, config.num_epochs, plan.total_steps, plan.start_step, plan.end_step - 1,
        )
        train_dataset.set_epoch(seed=plan.position(plan.start_step)[0])
        _show_examples(train_dataset, training_client, config.num_examples_to_show, ml_logger)
        evaluators = _build_evaluators(config, test_dataset)
        await _train(config, plan, training_client, train_dataset, evaluators, ml_logger)
    finally:
        ml_logger.close()


def cli_main(config: Config) -> None:
    asyncio.run(main(config))


if __name__ == "__main__":
    cli_utils.run_recipe(cli_main)
