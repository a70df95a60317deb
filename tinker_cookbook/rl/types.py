"""The RL environment abstractions: what a user subclasses to train on their own task.

An ``Env`` talks tokens: it hands the policy an observation (a ``tinker.ModelInput``) and a stop condition, and
scores the tokens the policy sampled. Envs are single-use (one episode each). An ``EnvGroupBuilder`` makes a group
of envs that are rolled out together, so rewards can be compared within the group (GRPO-style centring) or
computed jointly (pairwise preferences, self-play). An ``RLDataset`` yields batches of group builders.

Shape suffixes: ``_G`` = one entry per group member, ``_P`` = per problem (group) of a batch, ``_T`` = per token.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition, TokensWithLogprobs
from tinker_cookbook.utils import logtree

Action: TypeAlias = list[int]
Observation: TypeAlias = tinker.ModelInput
Logprobs: TypeAlias = list[float]
Metrics: TypeAlias = dict[str, float | int]
Logs: TypeAlias = dict[str, str | int | float]


@dataclass
class StepResult:
    """What an env returns for one action."""

    reward: float
    episode_done: bool
    next_observation: Observation
    """The next prompt (the full context, not only the new tokens); ignored when ``episode_done``."""
    next_stop_condition: StopCondition
    metrics: Metrics = field(default_factory=dict)
    """Numbers averaged into ``env/<tag>/<key>`` (e.g. ``correct``, ``format``)."""
    logs: Logs = field(default_factory=dict)
    """Free-form details shown in the HTML transcript, not aggregated."""


@dataclass
class Transition:
    """One turn of an episode: the observation, the sampled action and what the env made of it."""

    ob: Observation
    ac: TokensWithLogprobs
    reward: float
    episode_done: bool
    metrics: Metrics = field(default_factory=dict)
    logs: Logs = field(default_factory=dict)


class Env(ABC):
    """A stateful environment for one episode of one agent; discard it after the episode."""

    @abstractmethod
    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        """The first prompt and the stop condition for the policy's first action."""

    @abstractmethod
    async def step(self, action: Action) -> StepResult:
        """Score ``action`` (the sampled tokens) and give the next observation."""


@dataclass(frozen=True)
class Trajectory:
    """An episode: its transitions and the final observation (what the env would have shown next)."""

    transitions: list[Transition]
    final_ob: Observation


@dataclass
class GroupTranscript:
    """``logtree`` recordings of one group's rollout: each env's episode, and the group-reward computation."""

    episodes_G: list[logtree.Trace]
    group_rewards: logtree.Trace


@dataclass
class TrajectoryGroup:
    """The trajectories of one group, with the group-level rewards added to each.

    ``final_rewards_G`` and ``metrics_G`` come from ``EnvGroupBuilder.compute_group_rewards``.
    """

    trajectories_G: list[Trajectory]
    final_rewards_G: list[float]
    metrics_G: list[Metrics]
    transcript: GroupTranscript | None = field(default=None, repr=False, compare=False)
    """What the envs logged (``logtree``) while this group rolled out, when the loop asked for it."""

    def get_total_rewards(self) -> list[float]:
        """Per trajectory: the sum of its step rewards plus its group reward."""
        return [
            sum(t.reward for t in traj.transitions) + final
            for traj, final in zip(self.trajectories_G, self.final_rewards_G, strict=True)
        ]


class EnvGroupBuilder(ABC):
    """Makes a group of envs that are rolled out together (e.g. ``group_size`` copies of one problem)."""

    @abstractmethod
    async def make_envs(self) -> Sequence[Env]:
        """Fresh envs for one group."""

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Rewards that depend on the whole group (pairwise comparisons, self-play); none by default."""
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        """Tags under which this group's metrics are also reported (``env/<tag>/...``), e.g. the dataset name."""
        return []


class RLDataset(ABC):
    """A sequence of batches of env group builders.

    Only ``get_batch`` must be written (as in the docs); ``__len__`` has a default, see there.
    """

    @abstractmethod
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """Batch ``index`` (0-based); deterministic so that resuming replays the same data."""

    def __len__(self) -> int:
        """Number of batches.

        Default: the first index whose batch is empty or raises ``IndexError`` (how a dataset that slices a list
        ends), found with O(log n) calls of ``get_batch``. Override it when the dataset ends otherwise, or when
        building a batch is expensive. A dataset whose batches never run out raises TypeError: define ``__len__``.
        """
        if not self._has_batch(0):
            return 0
        high = 1
        while self._has_batch(high):  # exponential search for an index past the end ...
            high *= 2
            if high > _MAX_PROBED_BATCHES:
                raise TypeError(f"{type(self).__name__}.get_batch returns batches beyond index "
                                f"{_MAX_PROBED_BATCHES}; define __len__ to say how many batches there are")
        low = high // 2  # ... then bisect: batch `low` exists, batch `high` does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self._has_batch(mid) else (low, mid)
        return high

    def _has_batch(self, index: int) -> bool:
        try:
            return len(self.get_batch(index)) > 0
        except IndexError:
            return False


_MAX_PROBED_BATCHES = 2**40


@chz.chz
class RLDatasetBuilder:
    """Config that builds the train dataset and an optional test dataset (subclass and override ``__call__``)."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        raise NotImplementedError(f"{type(self).__name__} must implement async __call__() -> (train, test | None)")


def check_finite_reward(reward: float, where: str) -> float:
    """``reward`` as a float, or a ValueError naming ``where`` when it is NaN/inf or not a number."""
    try:
        value = float(reward)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} returned reward={reward!r}, which is not a number; return a finite float") from exc
    if not math.isfinite(value):
        raise ValueError(f"{where} returned reward={value}; rewards must be finite floats")
    return value
