"""The supervised fine-tuning loop: ``Config`` + ``main``.

    python -m tinker_cookbook.supervised.train model_name=... log_path=... dataset_builder=...

Recipes build a ``Config`` (``recipes/sl_basic.py``); ``recipes/sl_loop.py`` is the same algorithm as a flat,
self-contained script on the raw API, for reading.

Each step trains one batch: ``forward_backward`` with the ``cross_entropy`` loss, then ``optim_step`` (AdamW) at
``learning_rate * schedule(step)``. Steps are pipelined: step ``s + 1`` is queued before the results of step
``s`` are awaited, so the engine is never idle while the loop does its bookkeeping.

Steps, epochs and checkpoints (``run_core`` plans, saves and resumes every loop's run; ``checkpoint_utils`` has the
file format):

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
- Resuming (``behavior_if_log_dir_exists=resume``, or answering "resume") loads the last row with a
  ``state_path`` with its optimizer state, drops ``metrics.jsonl`` rows from that step on (they are recomputed),
  and continues from that row's (epoch, batch). A finished run is left alone; a log dir that holds a run of
  another model or dataset is refused.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import chz

from tinker_cookbook import cli_utils, run_core, tinker
from tinker_cookbook.eval.evaluators import EvaluatorBuilder
from tinker_cookbook.supervised.common import compute_mean_nll, count_loss_tokens
from tinker_cookbook.supervised.nll_evaluator import NLLEvaluator
from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder
from tinker_cookbook.tinker import types
from tinker_cookbook.utils import ml_log
from tinker_cookbook.utils.misc_utils import timed

logger = logging.getLogger(__name__)


@chz.chz
class Config(run_core.EpochRunConfig):
    """Supervised fine-tuning of a LoRA adapter."""

    dataset_builder: SupervisedDatasetBuilder
    """Builds the train (and optional test) dataset; the test set's NLL is evaluated every ``eval_every`` steps."""
    learning_rate: float = 1e-4
    """Peak learning rate of AdamW (``hyperparam_utils.get_lr`` suggests one per model)."""
    infrequent_evaluator_builders: list[EvaluatorBuilder] = chz.field(default_factory=list)
    """Evaluators run every ``infrequent_eval_every`` steps."""
    infrequent_eval_every: int = 100
    """Steps between infrequent evaluations (0: never)."""
    num_examples_to_show: int = 1
    """Training datums printed at the start, trained tokens highlighted."""

    @chz.validate
    def _check(self) -> None:
        run_core.check_learning_rate(self.learning_rate)
        if self.infrequent_eval_every < 0:
            raise ValueError(f"infrequent_eval_every={self.infrequent_eval_every} must be >= 0 (0 disables)")


# ---------------------------------------------------------------------------------------------------------
# Setup helpers
# ---------------------------------------------------------------------------------------------------------


def _build_evaluators(config: Config, test_dataset: SupervisedDataset | None) -> run_core.Evaluators:
    evaluators = run_core.Evaluators(log_path=config.log_path)
    if test_dataset is not None:
        evaluators.add(config.eval_every, [NLLEvaluator.from_dataset(test_dataset, name="test")])
    evaluators.add(config.eval_every, [builder() for builder in config.evaluator_builders])
    evaluators.add(config.infrequent_eval_every, [builder() for builder in config.infrequent_evaluator_builders])
    return evaluators


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


async def submit_step(
    training_client: tinker.TrainingClient, config: Config, plan: run_core.Plan, step: int, data: list[types.Datum]
) -> SubmittedStep:
    """Queue ``forward_backward`` and ``optim_step`` of ``step`` (back to back: the same engine turn)."""
    lr = config.learning_rate * config.lr_multiplier(plan, step)
    fwd_bwd = await training_client.forward_backward_async(data, "cross_entropy")
    optim = await training_client.optim_step_async(config.adam_params(lr))
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


async def _train(run: run_core.Run, config: Config, batches: run_core.EpochBatches,
                 evaluators: run_core.Evaluators) -> None:
    plan, training_client = run.plan, run.training_client
    previous: SubmittedStep | None = None
    last_row_time = time.perf_counter()
    for step in range(plan.start_step, plan.end_step):
        timings: dict[str, float] = {}
        # Everything queued so far ends with step - 1's optim_step: saves and evals here see exactly the
        # weights after `step` steps.
        pending_save = run.start_checkpoint_if_due(step)
        with timed("evals", timings):
            eval_metrics = await run_core.run_evaluators(evaluators.before_step(plan, step), training_client)
        with timed("get_batch", timings):
            data = batches.get(step)
        submitted = await submit_step(training_client, config, plan, step, data)
        submitted.metrics.update(eval_metrics)
        submitted.metrics.update(timings)
        if previous is not None:
            last_row_time = await _log_step(previous, run.ml_logger, last_row_time)
        if pending_save is not None:
            await pending_save.finish_async()
        previous = submitted
    assert previous is not None, f"no step between {plan.start_step} and {plan.end_step}"
    await _finish_run(run, evaluators, previous, last_row_time)


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


async def _finish_run(run: run_core.Run, evaluators: run_core.Evaluators, last: SubmittedStep,
                      last_row_time: float) -> None:
    """The last step's row (with the final model's evaluations when the run is finished) and the last checkpoint."""
    pending = run.start_last_checkpoint()
    final_metrics: dict[str, Any] = {}
    if run.plan.finished:
        with timed("evals", final_metrics):
            final_metrics.update(await run_core.run_evaluators(evaluators.after_run(run.plan), run.training_client))
    await _log_step(last, run.ml_logger, last_row_time, final_metrics)
    row = await pending.finish_async()
    what = "finished" if run.plan.finished else f"stopped at max_steps={run.config.max_steps}"
    logger.info("training %s after %d steps; last checkpoint %s", what, run.plan.end_step, row.get("state_path"))


async def main(config: Config) -> None:
    """Train per ``config``; see the module docstring for steps, checkpoints and resuming."""
    opened = await run_core.open_epoch_run(config, config.dataset_builder)
    if opened is None:
        return
    run, train_dataset, test_dataset = opened
    with run:
        batches = run_core.EpochBatches(train_dataset, run.plan)
        batches.enter_epoch_of(run.plan.start_step)
        _show_examples(train_dataset, run.training_client, config.num_examples_to_show, run.ml_logger)
        await _train(run, config, batches, _build_evaluators(config, test_dataset))


def run(config: Config) -> None:
    """Train per ``config`` from synchronous code (a script, a notebook): ``main`` run to the end."""
    run_core.run_sync(main, config)


def cli_main(config: Config) -> None:
    run(config)


if __name__ == "__main__":
    cli_utils.run_recipe(cli_main)
