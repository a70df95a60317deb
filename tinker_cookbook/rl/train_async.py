"""Async off-policy mode of the RL loop (``Config.async_config``).

Sampling workers keep rolling out groups with the newest sampler they have, while the trainer trains on groups as
they arrive: a step trains on the first ``groups_per_batch`` groups whose sampler is at most
``max_steps_off_policy`` steps older than the step. An older group is sampled again with the current weights
(its builder goes back in the queue) or, once the dataset has been handed out completely, dropped.

At most ``groups_per_batch · (max_steps_off_policy + 1)`` groups are sampled ahead of the trainer: the trainer
returns a group's slot only after the step that used it has updated the sampler, so with ``max_steps_off_policy=0``
nothing is sampled with weights that are about to change, and with ``k`` the extra ``k`` batches sampled during
training are at most ``k`` steps stale when they are used.

Logged per step (besides the sync mode's metrics): ``sampling_client/step_{min,max,mean}`` (which sampler the
groups came from), ``async/staleness_{mean,max}``, ``async/requeued_groups`` and ``async/dropped_groups``.
Resuming restarts sampling at the dataset batch that the checkpoint's step count corresponds to; groups that were
in flight are sampled again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tinker_cookbook import tinker
from tinker_cookbook.rl.metric_util import compute_trajectory_metrics
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.train_step import finish_substeps, prepare_data, split_groups, submit_substep
from tinker_cookbook.rl.types import EnvGroupBuilder, TrajectoryGroup
from tinker_cookbook.utils.misc_utils import timed

if TYPE_CHECKING:
    from tinker_cookbook.rl.train import RunContext

logger = logging.getLogger(__name__)


@dataclass
class _Sampler:
    client: tinker.SamplingClient
    step: int


@dataclass
class _Result:
    builder: EnvGroupBuilder
    sampler_step: int
    group: TrajectoryGroup | None
    error: BaseException | None = None


class _AsyncRun:
    """The shared state of the dataloader, the workers and the trainer."""

    def __init__(self, ctx: RunContext, sampling_client: tinker.SamplingClient) -> None:
        cfg = ctx.cfg.async_config
        assert cfg is not None
        self.ctx = ctx
        self.groups_per_batch = cfg.groups_per_batch
        self.max_off = cfg.max_steps_off_policy
        self.limit = cfg.groups_per_batch * (cfg.max_steps_off_policy + 1)
        self.sampler = _Sampler(sampling_client, ctx.start_batch)
        self.builders: asyncio.Queue[EnvGroupBuilder | None] = asyncio.Queue()
        self.results: asyncio.Queue[_Result | None] = asyncio.Queue()
        self.slots = asyncio.Semaphore(self.limit)
        self.loader_done = False
        self.live_workers = self.limit

    def first_data_batch(self) -> int:
        batch_len = max(len(self.ctx.dataset.get_batch(0)), 1)
        return self.ctx.start_batch * self.groups_per_batch // batch_len

    async def dataloader(self) -> None:
        for index in range(self.first_data_batch(), len(self.ctx.dataset)):
            for builder in self.ctx.dataset.get_batch(index):
                await self.builders.put(builder)
        self.loader_done = True
        for _ in range(self.live_workers):
            await self.builders.put(None)

    async def worker(self, worker_idx: int) -> None:
        calls = 0
        try:
            while True:
                await self.slots.acquire()
                builder = await self.builders.get()
                if builder is None:
                    return
                sampler = self.sampler
                policy = self.ctx.policy(sampler.client, sampler.step * 10_007 + worker_idx * 101 + calls)
                calls += 1
                try:
                    # Which groups a step's report shows is known only when the step collects them: record all
                    # (a recording holds only what the env logs, nothing when it logs nothing).
                    group = await do_group_rollout(builder, policy, record=self.ctx.cfg.num_groups_to_log > 0)
                    await self.results.put(_Result(builder, sampler.step, group))
                except Exception as exc:  # noqa: BLE001 - reported to the trainer, which applies the tolerance setting
                    await self.results.put(_Result(builder, sampler.step, None, exc))
        finally:
            self.live_workers -= 1
            if self.live_workers == 0:
                await self.results.put(None)

    async def collect(self, step: int, metrics: dict[str, float]) -> list[_Result] | None:
        """The groups for ``step`` (None when the data ran out first); stale ones are requeued or dropped."""
        batch: list[_Result] = []
        requeued = dropped = failed = 0
        while len(batch) < self.groups_per_batch:
            result = await self.results.get()
            if result is None:
                logger.warning("the dataset ran out at step %d with %d of %d groups; stopping", step, len(batch),
                               self.groups_per_batch)
                return None
            if result.error is not None:
                if not self.ctx.cfg.rollout_error_tolerance:
                    raise result.error
                logger.warning("skipping a group of %s: %s: %s", type(result.builder).__name__,
                               type(result.error).__name__, result.error)
                failed += 1
                self.slots.release()
            elif step - result.sampler_step > self.max_off:
                if self.loader_done:
                    dropped += 1
                else:
                    requeued += 1
                    await self.builders.put(result.builder)
                self.slots.release()
            else:
                batch.append(result)
        metrics.update({"async/requeued_groups": float(requeued), "async/dropped_groups": float(dropped),
                        "rollout/failed_groups": float(failed)})
        return batch

    async def train_step(self, step: int, batch: list[_Result], metrics: dict[str, float]) -> None:
        cfg = self.ctx.cfg
        # Groups and their builders stay paired (an advantage shaper reads per-dataset settings off the builder).
        groups_P = [r.group for r in batch if r.group is not None]
        builders_P = [r.builder for r in batch if r.group is not None]
        sampler_steps = [r.sampler_step for r in batch]
        staleness = [step - s for s in sampler_steps]
        metrics.update({
            "sampling_client/step_min": float(min(sampler_steps)), "sampling_client/step_max": float(max(sampler_steps)),
            "sampling_client/step_mean": sum(sampler_steps) / len(sampler_steps),
            "async/staleness_mean": sum(staleness) / len(staleness), "async/staleness_max": float(max(staleness)),
        })
        metrics.update(compute_trajectory_metrics(groups_P, [b.logging_tags() for b in builders_P]))
        substeps = []
        with timed("train", metrics):
            for part in split_groups(list(zip(groups_P, builders_P, strict=True)), cfg.num_substeps):
                data_D, prep = await prepare_data([g for g, _ in part], cfg.settings, self.ctx.reference_client,
                                                  [b for _, b in part], self.ctx.shaper)
                metrics.update(prep)
                if data_D:
                    substeps.append(await submit_substep(self.ctx.training_client, data_D, cfg.settings))
            if substeps:
                metrics.update(await finish_substeps(substeps))
            else:
                metrics["optim/skipped"] = 1.0
        self.ctx.log_transcript(step, groups_P, builders_P)

    async def trainer(self) -> tinker.SamplingClient:
        for step in range(self.ctx.start_batch, self.ctx.end_batch):
            metrics: dict[str, float] = self.ctx.progress(step)
            start = time.perf_counter()
            metrics.update(await self.ctx.maybe_eval(step, self.sampler.client))
            with timed("wait_for_groups", metrics), self.ctx.run.phase("sampling"):
                batch = await self.collect(step, metrics)
            if batch is None:
                break
            with self.ctx.run.phase("training"):
                await self.train_step(step, batch, metrics)
            next_client, checkpoint = await self.ctx.next_sampler(step, metrics)
            self.sampler = _Sampler(next_client, step + 1)
            for _ in batch:
                self.slots.release()
            metrics["time/total"] = time.perf_counter() - start
            await self.ctx.log_row(step, metrics, checkpoint)
        return self.sampler.client


async def run_async_training(ctx: RunContext, sampling_client: tinker.SamplingClient) -> tinker.SamplingClient:
    """Train steps ``ctx.start_batch .. ctx.end_batch`` off-policy; returns the final sampler."""
    run = _AsyncRun(ctx, sampling_client)
    tasks = [asyncio.ensure_future(run.dataloader())]
    tasks += [asyncio.ensure_future(run.worker(k)) for k in range(run.limit)]
    try:
        return await run.trainer()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
