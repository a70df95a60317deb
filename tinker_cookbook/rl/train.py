"""The RL training loop: sample groups of rollouts, centre rewards within each group, take a policy-gradient step.

Three modes share one ``Config`` and ``main``:

- sync (default): each iteration rolls out a whole batch with the current weights, then trains on it
  (``num_substeps`` optimizer steps, each on a slice of the batch's groups);
- streaming (``stream_minibatch_config``): still on-policy, but a minibatch is sent to ``forward_backward`` as soon
  as its groups have finished, overlapping sampling and training;
- async off-policy (``async_config``, in ``rl/train_async.py``): sampling never waits for training; groups sampled
  more than ``max_steps_off_policy`` steps before the step that would train on them are sampled again.

Per run ``log_path`` holds ``config.json``, ``metrics.jsonl`` (step = iteration), ``checkpoints.jsonl``, ``logs.log``
``iteration_NNNNNN/train.html`` (a few rollouts per iteration, with what their envs logged through ``logtree``) and
``iteration_NNNNNN/eval.html`` (the test set's rollouts, on the iterations that evaluate). Checkpoints, evaluations and resuming are every
loop's (``run_core``): the checkpoint ``%06d`` of ``s`` (``{"step": s, ...}``, the state after ``s`` iterations) is
taken after iteration ``s - 1`` when ``s % save_every == 0`` and recorded once row ``s - 1`` of ``metrics.jsonl``
is logged, and ``final`` at the end. A log dir of another model or dataset is refused, a rerun continues from the
last checkpoint after dropping the ``metrics.jsonl`` rows the interrupted attempt logged past it, and a run that
already reached its last iteration does nothing. The evaluators run before every ``eval_every``-th iteration and
once more after the last one (logged as the row after it).

``recipes/rl_loop.py`` is the flat, pedagogical twin of this loop on the raw API.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Literal

import chz

from tinker_cookbook import checkpoint_utils, cli_utils, run_core, tinker
from tinker_cookbook.completers import TinkerTokenCompleter
from tinker_cookbook.exceptions import AllTrajectoriesFailedError, ConfigurationError
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator, compute_trajectory_metrics
from tinker_cookbook.rl.rollouts import BatchRollout, do_batch_rollouts, do_group_rollout
from tinker_cookbook.rl.train_step import (
    AdvantageShaper,
    AdvantageShaperBuilder,
    SubmittedSubstep,
    TrainSettings,
    finish_substeps,
    prepare_data,
    split_groups,
    submit_forward_backward,
    submit_substep,
)
from tinker_cookbook.rl.transcripts import write_transcript
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder, TrajectoryGroup
from tinker_cookbook.utils import logtree
from tinker_cookbook.utils.misc_utils import iteration_dir, timed

logger = logging.getLogger(__name__)

LossFnName = Literal["importance_sampling", "ppo", "cispo", "dro"]


@chz.chz
class AsyncConfig:
    """Off-policy training: ``max_steps_off_policy`` = the oldest sampler (in steps) whose groups may be trained on."""

    max_steps_off_policy: int
    """Train on groups sampled at most this many steps before the step that trains on them."""
    groups_per_batch: int
    """Groups per training step."""


@chz.chz
class StreamMinibatchConfig:
    """Train each minibatch as soon as its groups are sampled; ``groups_per_batch`` must equal the batch size."""

    groups_per_batch: int
    """Groups per batch: the dataset's batch size."""
    num_minibatches: int
    """Minibatches per optimizer step, each sent to ``forward_backward`` as soon as its groups are done."""


@chz.chz
class KLReferenceConfig:
    """The reference policy of the KL penalty: a base model, or a ``sampler_weights/`` checkpoint of one."""

    base_model: str
    """The reference model."""
    load_checkpoint_path: str | None = None
    """A ``sampler_weights/`` checkpoint of ``base_model`` to use instead of the base weights."""


@chz.chz
class Config(run_core.RunConfig):
    """RL training of a LoRA adapter: sample groups, centre rewards within each group, take a policy-gradient step.

    The run's settings (``log_path``, ``model_name``, ``renderer_name``, ``lora_rank``, ``seed``, ``max_steps``, the
    evaluation and checkpoint cadence, ...) are ``run_core.RunConfig``'s; a step is one iteration (one dataset
    batch), and ``max_steps`` sets how many the run has (None: the whole dataset).
    """

    learning_rate: float
    """Learning rate of AdamW (constant)."""
    dataset_builder: RLDatasetBuilder
    """Builds the train (and optional test) dataset of environment groups."""
    max_tokens: int
    """The most tokens sampled per reply."""

    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    loss_fn: LossFnName = "importance_sampling"
    """The policy-gradient loss."""
    loss_fn_config: dict[str, float] | None = None
    """The loss's settings, e.g. ``{"clip_low_threshold": 0.8}`` for ppo/cispo, ``{"beta": 0.05}`` for dro."""
    num_substeps: int = 1
    """Optimizer steps per batch, each on a slice of its groups."""
    remove_constant_reward_groups: bool = False
    """Leave out groups whose samples all got the same reward (they carry no signal)."""
    rollout_error_tolerance: bool = False
    """False: an env error stops the run with that error. True: the failing group is logged and skipped."""

    kl_penalty_coef: float = 0.0
    """Weight of the KL penalty against the reference policy, added to the advantages (0: none)."""
    kl_discount_factor: float = 0.0
    """Discount with which each token's KL penalty also counts for the tokens before it (0: only its own)."""
    kl_reference_config: KLReferenceConfig | None = None
    """None: the KL penalty is against ``model_name`` itself (the untrained base)."""
    advantage_shaper: AdvantageShaperBuilder | None = None
    """Changes the per-token advantages of each minibatch after they are assembled (before the KL penalty), e.g.
    on-policy distillation's teacher term (``tinker_cookbook.distillation``); None: the advantages as computed."""

    async_config: AsyncConfig | None = None
    """Off-policy mode: sampling never waits for training (``rl/train_async.py``)."""
    stream_minibatch_config: StreamMinibatchConfig | None = None
    """Streaming mode: train minibatches as soon as their groups are sampled."""
    num_groups_to_log: int = 4
    """Groups per iteration written to ``iteration_NNNNNN/train.html``."""

    @chz.validate
    def _check(self) -> None:
        run_core.check_learning_rate(self.learning_rate)
        if self.max_tokens < 1:
            raise ConfigurationError(f"max_tokens={self.max_tokens} must be at least 1")
        if self.num_substeps < 1:
            raise ConfigurationError(f"num_substeps={self.num_substeps} must be at least 1")
        if self.async_config is not None and self.stream_minibatch_config is not None:
            raise ConfigurationError("async_config and stream_minibatch_config are both set; choose one mode")
        if self.async_config is not None and self.async_config.max_steps_off_policy < 0:
            raise ConfigurationError(
                f"async_config.max_steps_off_policy={self.async_config.max_steps_off_policy} must be >= 0")
        if self.kl_penalty_coef < 0:
            raise ConfigurationError(f"kl_penalty_coef={self.kl_penalty_coef} must be >= 0")

    @property
    def settings(self) -> TrainSettings:
        return TrainSettings(self.learning_rate, self.loss_fn, self.loss_fn_config,
                             self.remove_constant_reward_groups, self.kl_penalty_coef, self.kl_discount_factor)


# ---------------------------------------------------------------------------------------------------------
# Run state shared by the modes
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RunContext:
    """Everything a mode's loop needs besides the config: the open run (plan, logger, clients) and the RL parts."""

    cfg: Config
    run: run_core.Run
    dataset: RLDataset
    evaluators: run_core.Evaluators
    reference_client: tinker.SamplingClient | None
    tokenizer: Any
    shaper: AdvantageShaper | None = None

    @property
    def training_client(self) -> tinker.TrainingClient:
        return self.run.training_client

    @property
    def start_batch(self) -> int:
        return self.run.plan.start_step

    @property
    def end_batch(self) -> int:
        return self.run.plan.end_step

    def policy(self, sampling_client: tinker.SamplingClient, iteration: int) -> TinkerTokenCompleter:
        # Independent seed streams per (run seed, iteration): the completer adds its call index to this base.
        base_seed = random.Random(f"{self.cfg.seed}-{iteration}").randrange(2**30)
        return TinkerTokenCompleter(sampling_client, self.cfg.max_tokens, temperature=self.cfg.temperature,
                                    seed=base_seed)

    def progress(self, i: int) -> dict[str, float]:
        return {"progress/batch": float(i), "progress/done_frac": (i + 1) / max(self.end_batch, 1),
                "optim/lr": self.cfg.learning_rate}

    async def maybe_eval(self, i: int, sampling_client: tinker.SamplingClient, force: bool = False) -> dict[str, float]:
        """The evaluations due before iteration ``i`` (all of them when ``force``), on ``sampling_client``."""
        due = self.evaluators.due(i, final=force)
        if not due:
            return {}
        start = time.perf_counter()
        # Evaluators that log through logtree (the test set's rollouts, for one) write into this trace; the page is
        # kept only when one of them did (past the title and its date line).
        with logtree.init_trace(f"Evaluations before iteration {i}") as trace:
            metrics = await run_core.run_evaluators(due, self.training_client, sampling_client)
        if self.cfg.num_groups_to_log > 0 and len(trace.root.children) > 2:
            logtree.write_trace_html(trace, iteration_dir(self.cfg.log_path, i) / "eval.html")
        metrics["time/eval"] = time.perf_counter() - start
        return metrics

    async def next_sampler(self, i: int, metrics: dict[str, float]
                           ) -> tuple[tinker.SamplingClient, checkpoint_utils.PendingCheckpoint | None]:
        """The sampler for iteration ``i + 1`` (the periodic checkpoint's weights, or an in-memory snapshot), and
        the checkpoint to record with ``log_row`` once row ``i`` is logged."""
        with timed("save", metrics):
            pending = self.run.start_checkpoint_if_due(i + 1)
            if pending is not None:
                sampler_path = (await pending.futures["sampler_path"].result_async()).path
                return await self.run.service_client.create_sampling_client_async(model_path=sampler_path), pending
            return await self.training_client.save_weights_and_get_sampling_client_async(), None

    async def log_row(self, i: int, metrics: dict[str, float],
                      checkpoint: checkpoint_utils.PendingCheckpoint | None) -> None:
        """Log row ``i``, then record the checkpoint taken after iteration ``i``: in this order a run killed in
        between resumes from the checkpoint before and logs row ``i`` again, instead of never logging it."""
        self.run.ml_logger.log_metrics(metrics, step=i)
        if checkpoint is not None:
            await checkpoint.finish_async()

    def log_transcript(self, i: int, groups_P: list[TrajectoryGroup], builders_P: list[EnvGroupBuilder]) -> None:
        write_transcript(iteration_dir(self.cfg.log_path, i) / "train.html", f"Iteration {i}", groups_P, builders_P,
                         self.tokenizer, self.cfg.num_groups_to_log)


def _reference_client(cfg: Config, service_client: tinker.ServiceClient) -> tinker.SamplingClient | None:
    if cfg.kl_penalty_coef <= 0:
        return None
    ref = cfg.kl_reference_config
    if ref is not None and ref.load_checkpoint_path is not None:
        return service_client.create_sampling_client(model_path=ref.load_checkpoint_path)
    return service_client.create_sampling_client(base_model=ref.base_model if ref is not None else cfg.model_name)


def _context(cfg: Config, run: run_core.Run, dataset: RLDataset, test_dataset: RLDataset | None) -> RunContext:
    """The RL parts of an open run: evaluators (the given ones, then the test set's), reference policy, tokenizer."""
    evaluators = run_core.Evaluators(log_path=cfg.log_path)
    evaluators.add(cfg.eval_every, [builder() for builder in cfg.evaluator_builders])
    if test_dataset is not None:
        evaluators.add(cfg.eval_every, [RLTestSetEvaluator(test_dataset, cfg.max_tokens, temperature=cfg.temperature,
                                                           num_groups_to_log=cfg.num_groups_to_log)])
    shaper = cfg.advantage_shaper(run.service_client) if cfg.advantage_shaper is not None else None
    return RunContext(cfg, run, dataset, evaluators, _reference_client(cfg, run.service_client),
                      run.training_client.get_tokenizer(), shaper)


# ---------------------------------------------------------------------------------------------------------
# Sync and streaming modes
# ---------------------------------------------------------------------------------------------------------


def _check_batch(builders: list[EnvGroupBuilder], cfg: Config, i: int) -> None:
    if len(builders) == 0:
        raise ConfigurationError(f"dataset batch {i} is empty; the dataset must yield at least one group per batch")
    stream = cfg.stream_minibatch_config
    if stream is not None and len(builders) != stream.groups_per_batch:
        raise ConfigurationError(f"stream_minibatch_config.groups_per_batch={stream.groups_per_batch} differs from "
                                 f"the dataset's batch size {len(builders)}; set them equal")


async def _sync_train_step(ctx: RunContext, rollout: BatchRollout) -> dict[str, float]:
    """Train on a fully sampled batch: ``num_substeps`` optimizer steps, each on a slice of the groups."""
    metrics: dict[str, float] = {}
    substeps = []
    pairs = list(zip(rollout.groups_P, rollout.builders_P, strict=True))
    for part in split_groups(pairs, ctx.cfg.num_substeps):
        data_D, prep_metrics = await prepare_data([g for g, _ in part], ctx.cfg.settings, ctx.reference_client,
                                                  [b for _, b in part], ctx.shaper)
        _accumulate(metrics, prep_metrics)
        if data_D:
            substeps.append(await submit_substep(ctx.training_client, data_D, ctx.cfg.settings))
    if not substeps:
        logger.warning("no datums to train on in this batch (all groups had equal rewards); skipping the update")
        metrics["optim/skipped"] = 1.0
        return metrics
    metrics.update(await finish_substeps(substeps))
    return metrics


async def _stream_rollout_and_train(ctx: RunContext, builders: list[EnvGroupBuilder], i: int,
                                    sampling_client: tinker.SamplingClient) -> tuple[BatchRollout, dict[str, float]]:
    """Roll out the batch; each minibatch goes to ``forward_backward`` as soon as its groups are done.

    The batch is cut into ``num_substeps × num_minibatches`` minibatches in completion order; an ``optim_step``
    is queued after every ``num_minibatches`` of them (skipped when none of them had anything to train on).
    """
    stream = ctx.cfg.stream_minibatch_config
    assert stream is not None
    num_parts = ctx.cfg.num_substeps * stream.num_minibatches
    boundaries = list(itertools.accumulate(len(p) for p in split_groups(builders, num_parts)))
    policy = ctx.policy(sampling_client, i)
    tasks = [asyncio.ensure_future(_tolerant_group(b, policy, ctx.cfg.rollout_error_tolerance,
                                                   record=k < ctx.cfg.num_groups_to_log))
             for k, b in enumerate(builders)]
    done: list[tuple[TrajectoryGroup, EnvGroupBuilder]] = []
    waiting: list[tuple[TrajectoryGroup, EnvGroupBuilder]] = []
    substeps: list[SubmittedSubstep] = []
    metrics: dict[str, float] = {}
    finished, part, step_has_data = 0, 0, False
    for next_done in asyncio.as_completed(tasks):
        group, builder = await next_done
        finished += 1
        if group is not None:
            done.append((group, builder))
            waiting.append((group, builder))
        while part < num_parts and finished >= boundaries[part]:
            data_D, prep = await prepare_data([g for g, _ in waiting], ctx.cfg.settings, ctx.reference_client,
                                              [b for _, b in waiting], ctx.shaper)
            waiting = []
            _accumulate(metrics, prep)
            if data_D:
                substeps.append(await submit_forward_backward(ctx.training_client, data_D, ctx.cfg.settings))
                step_has_data = True
            part += 1
            if part % stream.num_minibatches == 0 and step_has_data:
                substeps[-1].optim = await ctx.training_client.optim_step_async(run_core.adam_params(ctx.cfg.learning_rate))
                step_has_data = False
    if not done:
        raise AllTrajectoriesFailedError(f"all {len(builders)} groups of batch {i} failed (see the warnings above)")
    rollout = BatchRollout([g for g, _ in done], [b for _, b in done], finished - len(done))
    if substeps:
        metrics.update(await finish_substeps(substeps))
    else:
        metrics["optim/skipped"] = 1.0
    return rollout, metrics


def _accumulate(metrics: dict[str, float], new: dict[str, float]) -> None:
    """Counts (``rollout/...``, ``optim/num_...``) add up over minibatches; other values keep the latest."""
    for key, value in new.items():
        summed = key.startswith(("rollout/", "optim/num"))
        metrics[key] = metrics.get(key, 0.0) + value if summed else value


async def _tolerant_group(builder: EnvGroupBuilder, policy: TinkerTokenCompleter, tolerate: bool, record: bool
                          ) -> tuple[TrajectoryGroup | None, EnvGroupBuilder]:
    try:
        return await do_group_rollout(builder, policy, record=record), builder
    except Exception as exc:
        if not tolerate:
            raise
        logger.warning("skipping a group of %s: %s: %s", type(builder).__name__, type(exc).__name__, exc)
        return None, builder


async def _run_iteration(ctx: RunContext, i: int, sampling_client: tinker.SamplingClient) -> tinker.SamplingClient:
    """One sync/streaming iteration; returns the sampler for the next one."""
    metrics: dict[str, float] = ctx.progress(i)
    start = time.perf_counter()
    metrics.update(await ctx.maybe_eval(i, sampling_client))
    builders = list(ctx.dataset.get_batch(i))
    _check_batch(builders, ctx.cfg, i)
    with timed("rollout_and_train", metrics):
        if ctx.cfg.stream_minibatch_config is not None:
            with ctx.run.phase("sampling+training"):
                rollout, train_metrics = await _stream_rollout_and_train(ctx, builders, i, sampling_client)
        else:
            with timed("rollout", metrics), ctx.run.phase("sampling"):
                rollout = await do_batch_rollouts(builders, ctx.policy(sampling_client, i),
                                                  ctx.cfg.rollout_error_tolerance, ctx.cfg.num_groups_to_log)
            with timed("train", metrics), ctx.run.phase("training"):
                train_metrics = await _sync_train_step(ctx, rollout)
    metrics.update(rollout.metrics)
    metrics.update(compute_trajectory_metrics(rollout.groups_P, [b.logging_tags() for b in rollout.builders_P]))
    metrics.update(train_metrics)
    ctx.log_transcript(i, rollout.groups_P, rollout.builders_P)
    next_client, checkpoint = await ctx.next_sampler(i, metrics)
    metrics["time/total"] = time.perf_counter() - start
    # The iteration split three ways: sampling (time/rollout), training (time/train; with streaming minibatches
    # the two overlap in time/rollout_and_train) and everything else (evals, logging, the next sampler snapshot:
    # time/save).
    metrics["time/other"] = metrics["time/total"] - metrics["time/rollout_and_train"]
    await ctx.log_row(i, metrics, checkpoint)
    return next_client


async def _finish(ctx: RunContext, sampling_client: tinker.SamplingClient) -> None:
    """Final eval (when evals are on), logged as the row after the last iteration, and the ``final`` checkpoint."""
    metrics = await ctx.maybe_eval(ctx.end_batch, sampling_client, force=True)
    if metrics:
        ctx.run.ml_logger.log_metrics(metrics, step=ctx.end_batch)
    await ctx.run.start_last_checkpoint().finish_async()


async def main(cfg: Config) -> None:
    """Train ``cfg.model_name`` with RL on ``cfg.dataset_builder``; see the module docstring."""
    resume = run_core.resume_point(cfg)
    dataset, test_dataset = await cfg.dataset_builder()
    # One pass over the dataset, as long as max_steps asks (the LR is constant, so the plan is this run's length).
    plan = run_core.make_plan(len(dataset), 1, cfg.max_steps, resume.row, max_steps_plans_run=True)
    run = await run_core.open_run(cfg, plan, resume)
    if run is None:
        return
    with run:
        ctx = _context(cfg, run, dataset, test_dataset)
        sampling_client = await ctx.training_client.save_weights_and_get_sampling_client_async()
        if cfg.async_config is not None:
            from tinker_cookbook.rl.train_async import run_async_training

            sampling_client = await run_async_training(ctx, sampling_client)
        else:
            for i in range(ctx.start_batch, ctx.end_batch):
                sampling_client = await _run_iteration(ctx, i, sampling_client)
        await _finish(ctx, sampling_client)


def run(cfg: Config) -> None:
    """Train per ``cfg`` from synchronous code (a script, a notebook): ``main`` run to the end."""
    run_core.run_sync(main, cfg)


if __name__ == "__main__":
    cli_utils.run_recipe(run)
