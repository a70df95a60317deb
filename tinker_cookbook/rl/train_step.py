"""The pieces of an RL iteration shared by the sync, streaming and async loops of ``rl/train.py``.

- ``prepare_data``: trajectory groups → metrics, advantages and datums (with the optional KL penalty and the
  config's ``AdvantageShaper``, e.g. on-policy distillation's per-token teacher term);
- ``submit_substep`` / ``finish_substeps``: ``forward_backward`` and ``optim_step`` submitted back to back, results
  awaited afterwards, so both land in the same engine cycle.

The HTML report of a few rollouts per iteration is ``rl/transcripts.py``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import chz
import numpy as np

from tinker_cookbook import run_core, tinker
from tinker_cookbook.rl.data_processing import (
    DatumSource,
    assemble_training_data,
    compute_advantages,
    datum_for_training,
    remove_constant_reward_groups,
)
from tinker_cookbook.rl.metrics import compute_kl_sample_train, incorporate_kl_penalty
from tinker_cookbook.rl.types import EnvGroupBuilder, TrajectoryGroup

logger = logging.getLogger(__name__)


class AdvantageShaper(Protocol):
    """Changes the assembled datums' per-token ``advantages`` before training (and returns metrics to log).

    Called once per minibatch with its datums, where each came from (``sources_D[d].group_idx`` indexes
    ``builders_P``) and the builders of its groups, so a shaper can look up per-dataset settings on the builder.
    Each datum's ``mask`` marks its sampled tokens and ``logprobs`` holds the sampler's logprobs of them.
    """

    async def __call__(self, data_D: list[tinker.Datum], sources_D: list[DatumSource],
                      builders_P: Sequence[EnvGroupBuilder]) -> tuple[list[tinker.Datum], dict[str, float]]: ...


@chz.chz
class AdvantageShaperBuilder:
    """Config of an ``AdvantageShaper``; the loop calls it once per run with the run's service client (subclass
    and override ``__call__``)."""

    def __call__(self, service_client: tinker.ServiceClient) -> AdvantageShaper:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(service_client) -> AdvantageShaper")

@dataclass(frozen=True)
class TrainSettings:
    """What a training step needs from the config."""

    learning_rate: float
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    remove_constant_reward_groups: bool
    kl_penalty_coef: float
    kl_discount_factor: float


async def prepare_data(
    groups_P: Sequence[TrajectoryGroup], settings: TrainSettings, reference_client: tinker.SamplingClient | None,
    builders_P: Sequence[EnvGroupBuilder] | None = None, shaper: AdvantageShaper | None = None,
) -> tuple[list[tinker.Datum], dict[str, float]]:
    """Datums (with ``mask``) of the groups worth training on, and the metrics of that preparation.

    ``builders_P`` (the builder of each group, needed with a ``shaper``) is filtered along with the groups.
    """
    metrics: dict[str, float] = {}
    if shaper is not None and (builders_P is None or len(builders_P) != len(groups_P)):
        raise ValueError("an advantage shaper needs the builder of every group (builders_P, one per group)")
    kept = list(range(len(groups_P)))
    if settings.remove_constant_reward_groups:
        varied = {id(g) for g in remove_constant_reward_groups(list(groups_P))}
        kept = [k for k in kept if id(groups_P[k]) in varied]
        metrics["rollout/constant_reward_groups_removed"] = float(len(groups_P) - len(kept))
    kept_groups = [groups_P[k] for k in kept]
    data_D, sources_D = assemble_training_data(kept_groups, compute_advantages(kept_groups))
    if data_D and shaper is not None:
        assert builders_P is not None
        data_D, shaper_metrics = await shaper(data_D, sources_D, [builders_P[k] for k in kept])
        metrics.update(shaper_metrics)
    if data_D and settings.kl_penalty_coef > 0:
        if reference_client is None:
            raise ValueError("kl_penalty_coef > 0 needs a reference sampling client")
        data_D, kl_metrics = await incorporate_kl_penalty(data_D, reference_client, settings.kl_penalty_coef,
                                                          settings.kl_discount_factor)
        metrics.update(kl_metrics)
    metrics["optim/num_datums"] = float(len(data_D))
    return data_D, metrics


@dataclass
class SubmittedSubstep:
    """The futures of one substep's ``forward_backward`` and (if submitted) ``optim_step``."""

    data_D: list[tinker.Datum]
    fwd_bwd: tinker.APIFuture[tinker.ForwardBackwardOutput]
    optim: tinker.APIFuture[tinker.OptimStepResponse] | None = None


async def submit_forward_backward(training_client: tinker.TrainingClient, data_D: list[tinker.Datum],
                                  settings: TrainSettings) -> SubmittedSubstep:
    """Queue ``forward_backward`` on the datums (client-side keys stripped); does not wait for it."""
    future = await training_client.forward_backward_async(
        [datum_for_training(d) for d in data_D], loss_fn=settings.loss_fn,  # type: ignore[arg-type]
        loss_fn_config=settings.loss_fn_config)
    return SubmittedSubstep(data_D=data_D, fwd_bwd=future)


async def submit_substep(training_client: tinker.TrainingClient, data_D: list[tinker.Datum],
                         settings: TrainSettings) -> SubmittedSubstep:
    """Queue ``forward_backward`` and, right behind it, ``optim_step``, without waiting in between."""
    substep = await submit_forward_backward(training_client, data_D, settings)
    substep.optim = await training_client.optim_step_async(run_core.adam_params(settings.learning_rate))
    return substep


async def finish_substeps(substeps: Sequence[SubmittedSubstep]) -> dict[str, float]:
    """Wait for the queued requests; returns loss, optimizer and sampler-vs-learner KL metrics."""
    all_data: list[tinker.Datum] = []
    train_logprobs: list[np.ndarray] = []
    metrics: dict[str, float] = {}
    loss = 0.0
    for substep in substeps:
        output = await substep.fwd_bwd.result_async()
        loss += float(output.metrics.get("loss:sum", 0.0))
        all_data += substep.data_D
        train_logprobs += [out["logprobs"].to_numpy() for out in output.loss_fn_outputs]
        if substep.optim is not None:
            optim_response = await substep.optim.result_async()
            metrics.update({f"optim/{k}": float(v) for k, v in (optim_response.metrics or {}).items()})
    metrics["optim/loss:sum"] = loss
    metrics.update(compute_kl_sample_train(all_data, train_logprobs))
    return metrics


def split_groups(items: Sequence[Any], num_parts: int) -> list[list[Any]]:
    """``items`` in ``num_parts`` contiguous, nearly equal parts (empty parts allowed when there are few items)."""
    base, extra = divmod(len(items), num_parts)
    parts, start = [], 0
    for i in range(num_parts):
        size = base + (1 if i < extra else 0)
        parts.append(list(items[start : start + size]))
        start += size
    return parts
