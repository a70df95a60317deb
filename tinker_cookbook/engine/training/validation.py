"""Checks of a training request's data and hyperparameters before the model runs.

Every refusal is a BadRequestError naming the field, what is wrong and how to fix it; checked data comes back as
tensors on the engine's device.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tinker_cookbook.engine import vision
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

if TYPE_CHECKING:
    from tinker_cookbook.engine.training.base_model import BaseModel


@dataclass
class DatumTensors:
    input_ids: torch.Tensor
    inputs: dict[str, torch.Tensor]
    images: tuple[vision.PreparedImage, ...] = ()



def datum_batch(base: BaseModel, data: Any, required: tuple[str, ...]) -> list[DatumTensors]:
    """``data`` (a request's list of ``types.Datum``) as checked tensors on ``base``'s device, with the loss
    inputs ``required``; BadRequestError naming the first bad field."""
    if not isinstance(data, (list, tuple)):
        hint = "; wrap a single datum in a list: [datum]" if isinstance(data, types.Datum) else ""
        raise BadRequestError(f"data is a {type(data).__name__} ({short(data)}), not a list of types.Datum{hint}")
    if not data:
        raise BadRequestError("data is empty; pass at least one Datum")
    return [_datum_tensors(base, i, d, required) for i, d in enumerate(data)]


def _datum_tensors(base: BaseModel, index: int, datum: Any, required: tuple[str, ...]) -> DatumTensors:
    where = f"data[{index}]"
    if not isinstance(datum, types.Datum):
        hint = " (build it with types.Datum(**that_dict))" if isinstance(datum, dict) else ""
        raise BadRequestError(f"{where} is a {type(datum).__name__} ({short(datum)}), not a types.Datum; pass a "
                              f"list of types.Datum(model_input=..., loss_fn_inputs=...){hint}")
    if not isinstance(datum.model_input, types.ModelInput):
        raise BadRequestError(f"{where}.model_input is a {type(datum.model_input).__name__}, not a "
                              "types.ModelInput; use types.ModelInput.from_ints(tokens)")
    tokens, images = vision.expand_model_input(datum.model_input, f"{where}.model_input", base.image_inputs,
                                               base.spec.name)
    n = len(tokens)
    if n == 0:
        raise BadRequestError(f"{where}.model_input is empty; every datum needs at least one token")
    limit = base.spec.max_context_length
    if n > limit:
        raise BadRequestError(f"{where}.model_input has {n} tokens, more than the context window {limit} of "
                              f"{base.spec.name}; truncate it (e.g. max_length in the dataset builder)")
    # Checked on the Python ints, before torch sees them: an id like 2**70 does not even fit in int64.
    bad_id = _first_outside(tokens, base.vocab_size)
    if bad_id is not None:
        raise BadRequestError(f"{where}.model_input holds token id {bad_id} outside the vocabulary "
                              f"[0, {base.vocab_size}); encode the text with this model's tokenizer")
    if not isinstance(datum.loss_fn_inputs, dict):
        raise BadRequestError(f"{where}.loss_fn_inputs is a {type(datum.loss_fn_inputs).__name__}, not a dict "
                              "of name -> TensorData")
    missing = [k for k in required if k not in datum.loss_fn_inputs]
    if missing:
        raise BadRequestError(f"{where}.loss_fn_inputs lacks {missing} (has {sorted(datum.loss_fn_inputs)})")
    # target_tokens first: its shape ([n], or [n, k] for k candidate tokens per position) is the shape of the
    # logprobs and of every other loss input.
    keys = sorted(required, key=lambda k: k != "target_tokens")
    inputs = {key: _loss_input(base, f"{where}.loss_fn_inputs[{key!r}]", key, datum.loss_fn_inputs[key], n)
              for key in keys}
    shape = inputs["target_tokens"].shape if "target_tokens" in inputs else None
    if shape is not None and any(v.shape != shape for v in inputs.values()):
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
        raise BadRequestError(f"{where} has loss inputs of different shapes (model_input has {n} tokens; {shapes}); "
                              f"every loss input must have the shape of target_tokens, {list(shape)}")
    device = base.device
    return DatumTensors(
        torch.tensor(tokens, dtype=torch.int64, device=device), {k: v.to(device) for k, v in inputs.items()},
        images,
    )


def _loss_input(base: BaseModel, where: str, key: str, td: Any, n: int) -> torch.Tensor:
    """One loss input as a checked tensor of shape ``[n]`` (or ``[n, k]``: k candidate tokens per position)."""
    if not isinstance(td, types.TensorData):
        raise BadRequestError(f"{where} is a {type(td).__name__}, not a types.TensorData; pass a list, a numpy "
                              "array or a torch tensor when building the Datum")
    if key == "target_tokens":
        if td.dtype != "int64":
            raise BadRequestError(f"{where} has dtype {td.dtype}; use int64")
        bad_id = _first_outside(td.data, base.vocab_size)
        if bad_id is not None:
            raise BadRequestError(f"{where} holds id {bad_id} outside the vocabulary [0, {base.vocab_size}); "
                                  "use token ids of this model's tokenizer")
    elif td.dtype != "float32":
        raise BadRequestError(f"{where} has dtype {td.dtype}; use float32")
    try:
        tensor = td.to_torch()
    except (ValueError, TypeError, OverflowError) as exc:  # data that does not fit its dtype or shape
        raise BadRequestError(f"{where} cannot be read as a {td.dtype} tensor of shape {td.shape} "
                              f"({type(exc).__name__}: {exc}); give {n} plain numbers") from exc
    if tensor.dim() not in (1, 2) or tensor.shape[0] != n or tensor.numel() == 0:
        raise BadRequestError(f"{where} has shape {list(tensor.shape)} but model_input has {n} tokens; each "
                              f"loss input must have shape [{n}] (or [{n}, k] with k >= 1 candidate tokens "
                              "per position, like target_tokens)")
    if key != "target_tokens" and not bool(torch.isfinite(tensor).all()):
        raise BadRequestError(f"{where} holds NaN or inf (or a value beyond the float32 range); all loss inputs "
                              "must be finite")
    return tensor



def _first_outside(ids: Iterable[Any], vocab_size: int) -> Any:
    """The first id that is not a number in [0, vocab_size), or None (Python ints, so that any size compares)."""
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < vocab_size:
            return t
    return None




def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."




def validate_adam(hp: Any) -> None:
    if not isinstance(hp, types.AdamParams):
        hint = " (a dict converts with types.AdamParams(**d))" if isinstance(hp, dict) else ""
        raise BadRequestError(f"adam_params={short(hp)} is a {type(hp).__name__}, not a types.AdamParams; pass e.g. "
                              f"types.AdamParams(learning_rate=1e-4){hint}")
    checks = [
        ("learning_rate", hp.learning_rate, lambda x: x >= 0, ">= 0"),
        ("beta1", hp.beta1, lambda x: 0 <= x < 1, "in [0, 1)"),
        ("beta2", hp.beta2, lambda x: 0 <= x < 1, "in [0, 1)"),
        ("eps", hp.eps, lambda x: x > 0, "> 0"),
        ("weight_decay", hp.weight_decay, lambda x: x >= 0, ">= 0"),
        ("grad_clip_norm", hp.grad_clip_norm, lambda x: x >= 0, ">= 0 (0 disables clipping)"),
    ]
    for name, value, ok, rule in checks:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
            raise BadRequestError(f"AdamParams.{name}={value!r} is invalid; it must be a finite number {rule}")


