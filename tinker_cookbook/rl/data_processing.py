"""From rolled-out trajectory groups to training datums.

- ``compute_advantages``: per group, advantage = total reward − group mean (GRPO-style centring, no std scaling).
- ``trajectory_to_data``: one datum per run of turns in which each observation extends the previous
  observation + action (the sequence-extension property); a turn that does not extend starts a new datum.
- ``assemble_training_data``: all datums of a batch, with where each came from.
- ``remove_constant_reward_groups``: drop groups whose members all got the same reward (zero advantage).

Datum layout: the full token sequence S (observations and actions interleaved) is shifted, so
``model_input = S[:-1]`` and ``target_tokens = S[1:]``; per target position ``logprobs`` holds the sampler's logprob
(0 for observation tokens), ``advantages`` the trajectory's advantage (0 for observation tokens) and ``mask``
1 for action tokens, 0 otherwise. ``mask`` is for the client's own metrics and is stripped before training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tinker_cookbook import tinker
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)

TRAINING_KEYS = ("target_tokens", "logprobs", "advantages")
"""The loss inputs that the RL losses read; other keys (``mask``) stay on the client."""


def compute_advantages(trajectory_groups_P: list[TrajectoryGroup]) -> list[list[float]]:
    """Per group, each trajectory's total reward minus the group's mean total reward."""
    advantages_P: list[list[float]] = []
    for group in trajectory_groups_P:
        rewards_G = group.get_total_rewards()
        mean = sum(rewards_G) / len(rewards_G)
        advantages_P.append([r - mean for r in rewards_G])
    return advantages_P


def _flat_tokens(model_input: tinker.ModelInput, what: str) -> list[int]:
    try:
        return model_input.to_ints()
    except ValueError as exc:
        raise ValueError(f"{what} holds non-text chunks; RL data processing supports text observations only") from exc


@dataclass
class _SequenceBuilder:
    """The growing token sequence of one datum and its per-token arrays (before shifting)."""

    tokens_T: list[int] = field(default_factory=list)
    logprobs_T: list[float] = field(default_factory=list)
    advantages_T: list[float] = field(default_factory=list)
    mask_T: list[float] = field(default_factory=list)

    def add_observation(self, tokens: list[int]) -> None:
        self.tokens_T += tokens
        self.logprobs_T += [0.0] * len(tokens)
        self.advantages_T += [0.0] * len(tokens)
        self.mask_T += [0.0] * len(tokens)

    def add_action(self, tokens: list[int], logprobs: list[float], advantage: float) -> None:
        if len(tokens) != len(logprobs):
            raise ValueError(f"an action has {len(tokens)} tokens but {len(logprobs)} logprobs; they must match")
        self.tokens_T += tokens
        self.logprobs_T += [float(lp) for lp in logprobs]
        self.advantages_T += [advantage] * len(tokens)
        self.mask_T += [1.0] * len(tokens)

    def to_datum(self) -> tinker.Datum:
        """The shifted datum: inputs S[:-1], targets and per-token arrays S[1:]."""
        # Lists are converted to TensorData by Datum's validator.
        loss_fn_inputs: dict[str, Any] = {
            "target_tokens": self.tokens_T[1:],
            "logprobs": self.logprobs_T[1:],
            "advantages": self.advantages_T[1:],
            "mask": self.mask_T[1:],
        }
        return tinker.Datum(model_input=tinker.ModelInput.from_ints(self.tokens_T[:-1]), loss_fn_inputs=loss_fn_inputs)


def trajectory_to_data(traj: Trajectory, traj_advantage: float) -> list[tinker.Datum]:
    """The datums of one trajectory, merging turns while the sequence only grows by appending.

    Turn k is merged into the current datum when its observation starts with everything the datum holds so far
    (previous observations and actions); only the new observation tokens are appended. Otherwise (e.g. a renderer
    that strips earlier reasoning) the current datum is closed and a new one starts from the full observation.
    """
    data: list[tinker.Datum] = []
    current = _SequenceBuilder()
    for i, transition in enumerate(traj.transitions):
        ob_tokens = _flat_tokens(transition.ob, f"transition {i} observation")
        held = current.tokens_T
        if held and ob_tokens[: len(held)] == held:
            current.add_observation(ob_tokens[len(held):])
        else:
            if held:
                data.append(current.to_datum())
            current = _SequenceBuilder()
            current.add_observation(ob_tokens)
        current.add_action(list(transition.ac.tokens), transition.ac.logprobs, traj_advantage)
    if len(current.tokens_T) >= 2:
        data.append(current.to_datum())
    return data


@dataclass(frozen=True)
class DatumSource:
    """Where a datum came from: its group in the batch and its trajectory in the group."""

    group_idx: int
    traj_idx: int


def assemble_training_data(
    trajectory_groups_P: list[TrajectoryGroup], advantages_P: list[list[float]]
) -> tuple[list[tinker.Datum], list[DatumSource]]:
    """All datums of a batch (trajectories with no action tokens give none) and the source of each."""
    data_D: list[tinker.Datum] = []
    sources_D: list[DatumSource] = []
    for group_idx, (group, advantages_G) in enumerate(zip(trajectory_groups_P, advantages_P, strict=True)):
        for traj_idx, (traj, advantage) in enumerate(zip(group.trajectories_G, advantages_G, strict=True)):
            for datum in trajectory_to_data(traj, advantage):
                data_D.append(datum)
                sources_D.append(DatumSource(group_idx, traj_idx))
    return data_D, sources_D


def remove_constant_reward_groups(trajectory_groups_P: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The groups whose members got different total rewards (the others have zero advantage everywhere)."""
    kept = [g for g in trajectory_groups_P if _reward_spread(g) > 0.0]
    if len(kept) < len(trajectory_groups_P):
        logger.info("dropped %d of %d groups whose rewards were all equal",
                    len(trajectory_groups_P) - len(kept), len(trajectory_groups_P))
    return kept


def _reward_spread(group: TrajectoryGroup) -> float:
    rewards_G = group.get_total_rewards()
    return max(rewards_G) - min(rewards_G)


def datum_for_training(datum: tinker.Datum) -> tinker.Datum:
    """The datum with only the keys the loss reads (drops ``mask`` and any other client-side key)."""
    return tinker.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={k: v for k, v in datum.loss_fn_inputs.items() if k in TRAINING_KEYS},
    )
