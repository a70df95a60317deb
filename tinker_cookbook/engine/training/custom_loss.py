"""A user's loss on per-datum logprobs (``forward_backward_custom``), applied through a linear surrogate.

The user's function runs on leaf copies of the logprobs; autograd gives g = dL/dlogp; the training pass then
backpropagates the token loss sum(g · logp) (``surrogate``), whose gradient equals direct autograd of the loss.
Everything the user's function returns is checked first, so a rejected loss accumulates nothing.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from tinker_cookbook.engine.training.forward import TokenLoss
from tinker_cookbook.engine.training.validation import short
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, TinkerError, UnprocessableEntityError

CustomLossFn = Callable[[list[types.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


def run_custom_loss(loss_fn: CustomLossFn, data: list[types.Datum], logps: list[torch.Tensor]
                    ) -> tuple[float, dict[str, float], list[torch.Tensor]]:
    """Run the user's loss on leaf copies of ``logps``: (loss, metrics, dloss/dlogp per datum), all checked."""
    leaves = [lp.clone().requires_grad_(True) for lp in logps]
    try:
        result = loss_fn(data, leaves)
    except TinkerError:
        raise
    except Exception as exc:  # the user's code failed, not the engine
        raise BadRequestError(f"the custom loss_fn raised {type(exc).__name__}: {exc}; fix the loss function (it "
                              "gets the data and one logprob tensor per datum)") from exc
    if not isinstance(result, tuple) or len(result) != 2:
        raise BadRequestError(f"custom loss_fn must return (scalar loss tensor, metrics dict), got {short(result)}")
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.dtype.is_floating_point:
        raise BadRequestError(f"custom loss_fn must return (scalar tensor, metrics), got loss={short(loss)}")
    value = float(loss.detach())
    if not math.isfinite(value):
        raise UnprocessableEntityError(f"forward_backward_custom refused: the custom loss is {value}; nothing was "
                                       "accumulated. Make the loss finite (e.g. guard logs and divisions)")
    checked = custom_metrics(metrics)
    coeffs: tuple[torch.Tensor | None, ...] = (None,) * len(leaves)
    if loss.requires_grad:  # a loss that does not depend on the logprobs has zero gradient
        try:
            coeffs = torch.autograd.grad(loss, leaves, allow_unused=True)
        except RuntimeError as exc:
            raise BadRequestError(f"the gradient of the custom loss could not be computed ({exc}); build the loss "
                                  "from the given logprob tensors without in-place changes to them") from exc
    weights = [(c if c is not None else torch.zeros_like(lp)).detach() for c, lp in zip(coeffs, logps, strict=True)]
    bad = [i for i, w in enumerate(weights) if not bool(torch.isfinite(w).all())]
    if bad:
        raise UnprocessableEntityError(f"forward_backward_custom refused: the gradient of the custom loss with respect "
                                       f"to logprobs[{bad[0]}] holds NaN or inf; nothing was accumulated. Make the "
                                       "loss smooth where it is evaluated (e.g. no sqrt or log at 0)")
    return value, checked, weights


def custom_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, dict):
        raise BadRequestError(f"custom loss_fn must return (loss, metrics) with metrics a dict of str -> float, got "
                              f"metrics={short(metrics)}")
    checked: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise BadRequestError(f"custom loss_fn metrics[{key!r}]={short(value)} is not a float; return plain "
                                  "floats keyed by name, e.g. {'kl': float(kl.detach())}")
        checked[key] = float(value)
    return checked




def surrogate(coeffs: torch.Tensor) -> TokenLoss:
    """The token loss sum(coeffs · logp), whose gradient is the custom loss's (``coeffs`` = dloss/dlogp)."""
    reach = (coeffs != 0).any(dim=-1) if coeffs.dim() == 2 else coeffs != 0
    return TokenLoss(lambda logp, span: (logp * coeffs[span]).sum(), reach)


