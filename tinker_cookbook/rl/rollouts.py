"""Rolling out policies in envs.

Every env of a group, and every group of a batch, runs as its own asyncio task: their ``sample_async`` requests
are in flight at the same time, so the engine's sampler batches them into shared forward passes.

Failures: an env whose ``step`` (or ``initial_observation``) raises, a non-finite reward, or a malformed stop
condition fails its whole group. ``do_batch_rollouts`` either re-raises the first such error (the default) or,
with ``skip_failed_groups=True``, logs it, drops the group and reports the count; a batch in which every group
failed raises ``AllTrajectoriesFailedError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from tinker_cookbook.completers import StopCondition, TokenCompleter
from tinker_cookbook.exceptions import AllTrajectoriesFailedError
from tinker_cookbook.rl.types import (
    Env,
    EnvGroupBuilder,
    GroupTranscript,
    Trajectory,
    TrajectoryGroup,
    Transition,
    check_finite_reward,
)
from tinker_cookbook.utils import logtree

logger = logging.getLogger(__name__)


def check_stop_condition(stop: StopCondition, env: Env) -> StopCondition:
    """``stop`` as a list; a TypeError (not a list) or ValueError (bad entries) naming the env otherwise."""
    where = f"{type(env).__name__} stop condition"
    if not isinstance(stop, (list, tuple)):
        raise TypeError(f"{where} is {stop!r}; return a list of stop strings or a list of token ids")
    entries: list = list(stop)
    if all(isinstance(s, str) for s in entries):
        if any(s == "" for s in entries):
            raise ValueError(f"{where} {entries!r} holds an empty string, which would stop at once; remove it")
        return entries
    if all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in entries):
        return entries
    raise ValueError(f"{where} {entries!r} mixes types or holds negative ids; use only strings or only token ids >= 0")


async def do_single_rollout(policy: TokenCompleter, env: Env) -> Trajectory:
    """Run one episode: sample an action for each observation until the env says the episode is done."""
    transitions: list[Transition] = []
    ob, stop = await env.initial_observation()
    stop = check_stop_condition(stop, env)
    while True:
        action = await policy(ob, stop)
        result = await env.step(action.tokens)
        reward = check_finite_reward(result.reward, f"{type(env).__name__}.step")
        transitions.append(Transition(ob=ob, ac=action, reward=reward, episode_done=result.episode_done,
                                      metrics=dict(result.metrics), logs=dict(result.logs)))
        if result.episode_done:
            return Trajectory(transitions=transitions, final_ob=result.next_observation)
        ob, stop = result.next_observation, check_stop_condition(result.next_stop_condition, env)


async def _episode(policy: TokenCompleter, env: Env, record: bool) -> tuple[Trajectory, logtree.Trace | None]:
    if not record:
        return await do_single_rollout(policy, env), None
    with logtree.detached_trace() as recording:
        return await do_single_rollout(policy, env), recording


async def do_group_rollout(builder: EnvGroupBuilder, policy: TokenCompleter, record: bool = False
                           ) -> TrajectoryGroup:
    """Roll out every env of the group concurrently and add the group rewards.

    With ``record``, what each env (and ``compute_group_rewards``) logs through ``logtree`` is recorded into the
    group's ``transcript``; otherwise it goes to whatever trace is active (usually none: then it costs nothing).
    """
    envs_G = await builder.make_envs()
    if not envs_G:
        raise ValueError(f"{type(builder).__name__}.make_envs returned no envs; a group needs at least one")
    results = await asyncio.gather(*(_episode(policy, env, record) for env in envs_G), return_exceptions=True)
    episodes: list[tuple[Trajectory, logtree.Trace | None]] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        episodes.append(result)
    trajectories_G = [traj for traj, _ in episodes]
    with logtree.detached_trace() if record else nullcontext() as rewards_log:
        group_rewards = await builder.compute_group_rewards(trajectories_G, envs_G)
    transcript = None
    if rewards_log is not None:
        transcript = GroupTranscript([rec for _, rec in episodes if rec is not None], rewards_log)
    if len(group_rewards) != len(trajectories_G):
        raise ValueError(f"{type(builder).__name__}.compute_group_rewards returned {len(group_rewards)} rewards "
                         f"for {len(trajectories_G)} trajectories; return one (reward, metrics) per trajectory")
    where = f"{type(builder).__name__}.compute_group_rewards"
    return TrajectoryGroup(
        trajectories_G=trajectories_G,
        final_rewards_G=[check_finite_reward(r, where) for r, _ in group_rewards],
        metrics_G=[dict(m) for _, m in group_rewards],
        transcript=transcript,
    )


@dataclass
class BatchRollout:
    """The groups of a batch that rolled out, with their builders, and the failures that were skipped."""

    groups_P: list[TrajectoryGroup]
    builders_P: list[EnvGroupBuilder]
    num_failed_groups: int

    @property
    def metrics(self) -> dict[str, float]:
        return {"rollout/failed_groups": float(self.num_failed_groups)}


async def do_batch_rollouts(
    builders: Sequence[EnvGroupBuilder], policy: TokenCompleter, skip_failed_groups: bool = False,
    num_recorded: int = 0,
) -> BatchRollout:
    """Roll out all groups concurrently; failed groups raise, or are logged and skipped with ``skip_failed_groups``.

    The first ``num_recorded`` groups record their envs' ``logtree`` output (see ``do_group_rollout``)."""
    results = await asyncio.gather(*(do_group_rollout(b, policy, record=i < num_recorded)
                                     for i, b in enumerate(builders)), return_exceptions=True)
    groups, kept_builders, failures = [], [], 0
    for builder, result in zip(builders, results, strict=True):
        if isinstance(result, BaseException):
            if not skip_failed_groups or not isinstance(result, Exception):
                raise result
            failures += 1
            logger.warning("skipping a group of %s (tags %s): %s: %s", type(builder).__name__,
                           builder.logging_tags(), type(result).__name__, result)
            continue
        groups.append(result)
        kept_builders.append(builder)
    if builders and not groups:
        raise AllTrajectoriesFailedError(
            f"all {len(builders)} groups of the batch failed (see the warnings above); fix the env or its data")
    return BatchRollout(groups, kept_builders, failures)
