"""The built-in losses of ``forward_backward``, exactly as the Tinker docs define them.

Each loss maps one datum's per-token learner logprobs ``logp`` (shape ``(N,)``, with grad) and its loss inputs to
a scalar. All are *sums* over tokens: any normalisation (per sequence, per batch) is the caller's, baked into
``weights`` or ``advantages``. ``q`` below is the sampler's logprob (input ``logprobs``), ``A`` the advantage.

- cross_entropy:        -sum(w * logp)
- importance_sampling:  -sum(exp(logp - q) * A)
- ppo:                  -sum(min(r * A, clip(r, lo, hi) * A)),  r = exp(logp - q), lo/hi default 0.8/1.2
- cispo:                -sum(sg(clip(r, lo, hi)) * logp * A),    lo/hi default 0.8/1.2
- dro:                  -sum(logp * A - beta/2 * (logp - q)^2),  beta default 0.05
- gspo (GSPO-token):    -sum(min(s_t * A, clip(s_t, lo, hi) * A)),  lo/hi default 0.8/1.2, where
                        s = exp(mean over the positions M that sequence_ratio_mask marks of sg(logp) - q) is the
                        sequence ratio and s_t = s * exp(logp - sg(logp)) carries s's value and logp's gradient

``stable_reinforce`` is refused: its objective depends on information the hosted service records at sampling time
and has not published, so no faithful implementation is possible (``UNAVAILABLE`` says so to the caller).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tinker_cookbook.tinker.errors import BadRequestError

LossInputs = dict[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, LossInputs, dict[str, float]], torch.Tensor]


SequenceInputs = Callable[[torch.Tensor, LossInputs], LossInputs]
"""A datum's detached logprobs and loss inputs -> extra loss inputs of the same shape."""
GradientReach = Callable[[LossInputs], torch.Tensor]
"""A datum's loss inputs -> bool ``[N]``: the positions whose logprob the loss's gradient can be non-zero at."""


@dataclass(frozen=True)
class LossSpec:
    fn: LossFn
    required_inputs: tuple[str, ...]
    config_defaults: dict[str, float]
    reach: GradientReach | None = None
    """Where the gradient can be non-zero (None: everywhere). The engine backpropagates only those positions'
    logprobs through the unembedding: in RL most positions are the prompt's, with advantage 0."""
    sequence_inputs: SequenceInputs | None = None
    """For a loss that needs a statistic of the whole sequence (GSPO's ratio): the extra per-position inputs it
    reads, from a datum's detached logprobs. The engine computes them from a first pass without gradients, so the
    loss stays a sum of per-token terms that a chunked backward can evaluate span by span."""


def _nonzero_positions(key: str) -> GradientReach:
    """Positions where ``inputs[key]`` is non-zero: the loss is that input times a function of logp there, so its
    gradient is exactly 0 elsewhere (any k candidate columns of a position count)."""

    def reach(inputs: LossInputs) -> torch.Tensor:
        values = inputs[key]
        nonzero = values != 0
        return nonzero.any(dim=-1) if nonzero.dim() == 2 else nonzero

    return reach


def cross_entropy(logp: torch.Tensor, inputs: LossInputs, config: dict[str, float]) -> torch.Tensor:
    return -(logp * inputs["weights"]).sum()


def importance_sampling(logp: torch.Tensor, inputs: LossInputs, config: dict[str, float]) -> torch.Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


def ppo(logp: torch.Tensor, inputs: LossInputs, config: dict[str, float]) -> torch.Tensor:
    advantages = inputs["advantages"]
    ratio = torch.exp(logp - inputs["logprobs"])
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def cispo(logp: torch.Tensor, inputs: LossInputs, config: dict[str, float]) -> torch.Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"]).detach()
    return -(clipped * logp * inputs["advantages"]).sum()


def dro(logp: torch.Tensor, inputs: LossInputs, config: dict[str, float]) -> torch.Tensor:
    quadratic = (logp - inputs["logprobs"]) ** 2
    return -(logp * inputs["advantages"] - 0.5 * config["beta"] * quadratic).sum()


SEQUENCE_LOG_RATIO = "sequence_log_ratio"
"""GSPO's sequence log-ratio, repeated at every position (an engine-made input; clients never send it)."""


def gspo_sequence_inputs(logp: torch.Tensor, inputs: LossInputs) -> LossInputs:
    """The mean of ``logp - q`` over the positions ``sequence_ratio_mask`` marks, at every position."""
    marked = inputs["sequence_ratio_mask"] != 0
    if not bool(marked.any()):
        raise ValueError("loss_fn_inputs['sequence_ratio_mask'] marks no position (all zeros); mark the sampled "
                         "tokens the sequence ratio is taken over with 1")
    log_ratio = (logp.detach() - inputs["logprobs"])[marked].mean()
    return {SEQUENCE_LOG_RATIO: torch.full_like(inputs["logprobs"], float(log_ratio))}


def gspo(logp: torch.Tensor, inputs: LossInputs, config: dict[str, float]) -> torch.Tensor:
    advantages = inputs["advantages"]
    # Value exp(sequence log-ratio), gradient that of exp(logp) at logp's value: GSPO-token's s_t.
    ratio = torch.exp(inputs[SEQUENCE_LOG_RATIO] + logp - logp.detach())
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
_RL_INPUTS = ("target_tokens", "logprobs", "advantages")

LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(cross_entropy, ("target_tokens", "weights"), {}, _nonzero_positions("weights")),
    "importance_sampling": LossSpec(importance_sampling, _RL_INPUTS, {}, _nonzero_positions("advantages")),
    "ppo": LossSpec(ppo, _RL_INPUTS, dict(_CLIP_DEFAULTS), _nonzero_positions("advantages")),
    "cispo": LossSpec(cispo, _RL_INPUTS, dict(_CLIP_DEFAULTS), _nonzero_positions("advantages")),
    # DRO's quadratic penalty pulls on every position, whatever its advantage.
    "dro": LossSpec(dro, _RL_INPUTS, {"beta": 0.05}),
    "gspo": LossSpec(gspo, (*_RL_INPUTS, "sequence_ratio_mask"), dict(_CLIP_DEFAULTS),
                     _nonzero_positions("advantages"), gspo_sequence_inputs),
}

UNAVAILABLE: dict[str, str] = {
    "stable_reinforce": (
        "loss_fn='stable_reinforce' is not available on this engine: its objective uses stability information the "
        "hosted Tinker service records at sampling time (record_stability_info) and has not published, so it "
        "cannot be reproduced faithfully here. Train with 'ppo', 'cispo' or 'gspo' (clipped, stable off-policy) or "
        "'importance_sampling' instead"),
}
"""Losses the official SDK names that this engine refuses, and why."""


def get_loss(name: Any) -> LossSpec:
    if isinstance(name, str) and name in UNAVAILABLE:
        raise BadRequestError(UNAVAILABLE[name])
    if not isinstance(name, str) or name not in LOSSES:
        raise BadRequestError(f"loss_fn={name!r} is not a built-in loss; choose one of {sorted(LOSSES)}")
    return LOSSES[name]


def resolve_config(name: str, config: Any) -> dict[str, float]:
    """The loss's defaults overridden by ``config``, every value checked against ``CONFIG_RANGES``.

    Unknown keys are an error (a typo would silently do nothing), and so is any non-finite or out-of-range value:
    a NaN or inf here would reach the gradients and, through ``optim_step``, every weight of the adapter.
    """
    spec = get_loss(name)
    if config is not None and not isinstance(config, Mapping):
        raise BadRequestError(
            f"loss_fn_config={config!r} is a {type(config).__name__}, not a dict; pass None (the defaults) or a dict "
            f"of the loss's keys, for {name!r}: {spec.config_defaults or 'no keys, so None'}"
        )
    merged = dict(spec.config_defaults)
    for key, value in (config or {}).items():
        if key not in spec.config_defaults:
            allowed = sorted(spec.config_defaults) or "none"
            raise BadRequestError(f"loss_fn_config key {key!r} is not used by loss {name!r}; allowed keys: {allowed}")
        merged[key] = _config_number(key, value, spec.config_defaults[key])
    return merged


CONFIG_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    # The ratio r = p/q is 1 on-policy; a clip range that excludes 1 would clip (and zero the gradient of) even
    # the freshest samples, so the thresholds must bracket 1 (which also orders them). Low 0 = no lower clip.
    "clip_low_threshold": (lambda x: 0.0 <= x <= 1.0, "in [0, 1]"),
    "clip_high_threshold": (lambda x: x >= 1.0, ">= 1"),
    # beta weighs DRO's quadratic penalty; 0 would remove it and a negative value would reward drifting away.
    "beta": (lambda x: x > 0.0, "> 0"),
}
"""The allowed range of each finite ``loss_fn_config`` value, and how an error message states it."""


def _config_number(key: str, value: Any, default: float) -> float:
    in_range, rule = CONFIG_RANGES[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadRequestError(
            f"loss_fn_config[{key!r}]={value!r} is not a number; pass a finite float such as {default}"
        )
    number = float(value)
    if not math.isfinite(number):
        raise BadRequestError(
            f"loss_fn_config[{key!r}]={number} is not a finite number; pass a finite float such as {default}"
        )
    if not in_range(number):
        raise BadRequestError(f"loss_fn_config[{key!r}]={number} is out of range; it must be {rule} (default {default})")
    return number
