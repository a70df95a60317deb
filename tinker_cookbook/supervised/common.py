"""From (tokens, per-token weights) to a training ``Datum``, and the NLL of a batch.

A sequence of ``L`` positions ``x_0 .. x_{L-1}`` with weights ``w_0 .. w_{L-1}`` becomes one next-token datum:

    model_input  = x_0 .. x_{L-2}        (right-shifted: the last position predicts nothing)
    target_tokens = x_1 .. x_{L-1}       (left-shifted: position i is trained to predict x_{i+1})
    weights       = w_1 .. w_{L-1}       (the weight of a token is the weight of predicting it)

so ``w_0`` never counts (nothing predicts the first token). Image positions can be inputs but never targets:
their target id is 0 and their weight 0.

``reduction`` says how a sequence's weights are scaled, because the ``cross_entropy`` loss is a plain sum
``-sum(weights * logprobs)``:

- ``"mean"``: scale to sum to 1, so every sequence counts the same however many tokens it trains
  (the loss of a batch is the sum of the per-sequence mean NLLs);
- ``"none"``: keep the weights as given (a token sum; DPO and custom losses want this).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import numpy as np
import torch

from tinker_cookbook.exceptions import DataError
from tinker_cookbook.tinker import types

Reduction: TypeAlias = Literal["mean", "none"]
REDUCTIONS: tuple[str, ...] = ("mean", "none")
WeightsLike: TypeAlias = Sequence[float] | torch.Tensor | np.ndarray


def _as_float_list(weights: WeightsLike) -> list[float]:
    if isinstance(weights, torch.Tensor):
        return [float(w) for w in weights.detach().cpu().reshape(-1).tolist()]
    return [float(w) for w in np.asarray(weights, dtype=np.float64).reshape(-1)]


def truncate_model_input(
    model_input: types.ModelInput, weights: list[float], max_length: int
) -> tuple[types.ModelInput, list[float]]:
    """Keep the first ``max_length`` positions; an image chunk that does not fit is dropped whole (with all
    that follows it), since part of an image is not a valid input."""
    if max_length <= 0:
        raise DataError(f"max_length={max_length} must be positive")
    kept: list[types.ModelInputChunk] = []
    used = 0
    for chunk in model_input.chunks:
        if used + chunk.length <= max_length:
            kept.append(chunk)
            used += chunk.length
            continue
        room = max_length - used
        if isinstance(chunk, types.EncodedTextChunk) and room > 0:
            kept.append(types.EncodedTextChunk(tokens=list(chunk.tokens)[:room]))
            used += room
        break
    return types.ModelInput(chunks=kept), weights[:used]


def _drop_trailing_images(
    chunks: list[types.ModelInputChunk], weights: list[float]
) -> tuple[list[types.ModelInputChunk], list[float]]:
    # An image at the end has no following token to predict; an empty text chunk carries nothing.
    while chunks and (not isinstance(chunks[-1], types.EncodedTextChunk) or chunks[-1].length == 0):
        weights = weights[: len(weights) - chunks[-1].length]
        chunks = chunks[:-1]
    return chunks, weights


def create_rightshifted_model_input_and_leftshifted_targets(
    chunks: Sequence[types.ModelInputChunk],
) -> tuple[types.ModelInput, list[int]]:
    """``(x_0 .. x_{L-2}, [x_1 .. x_{L-1}])`` for a sequence ending in a text token; image targets are 0."""
    chunks = [c for c in chunks if c.length > 0]
    if not chunks or not isinstance(chunks[-1], types.EncodedTextChunk):
        raise DataError("the sequence must end with a text token (drop trailing images first)")
    position_targets: list[int] = []
    for chunk in chunks:
        if isinstance(chunk, types.EncodedTextChunk):
            position_targets.extend(int(t) for t in chunk.tokens)
        else:
            position_targets.extend([0] * chunk.length)
    last = chunks[-1]
    assert isinstance(last, types.EncodedTextChunk)
    shortened = [*chunks[:-1]]
    if last.length > 1:
        shortened.append(types.EncodedTextChunk(tokens=list(last.tokens)[:-1]))
    return types.ModelInput(chunks=shortened), position_targets[1:]


def _image_positions(chunks: Sequence[types.ModelInputChunk]) -> list[bool]:
    flags: list[bool] = []
    for chunk in chunks:
        flags.extend([not isinstance(chunk, types.EncodedTextChunk)] * chunk.length)
    return flags


def datum_from_model_input_weights(
    model_input: types.ModelInput,
    weights: WeightsLike,
    max_length: int | None = None,
    reduction: Reduction = "mean",
) -> types.Datum:
    """A ``cross_entropy`` datum (``target_tokens``, ``weights``) for a weighted sequence; see the module doc."""
    if reduction not in REDUCTIONS:
        raise DataError(f"reduction={reduction!r} is not valid; use one of {list(REDUCTIONS)}")
    w = _as_float_list(weights)
    if len(w) != model_input.length:
        raise DataError(f"weights has {len(w)} entries but model_input has {model_input.length} positions")
    if max_length is not None and model_input.length > max_length:
        model_input, w = truncate_model_input(model_input, w, max_length)
    chunks, w = _drop_trailing_images(list(model_input.chunks), w)
    if sum(c.length for c in chunks) < 2:
        raise DataError(
            f"a sequence needs at least 2 positions to train on (one input, one target), got "
            f"{sum(c.length for c in chunks)}" + (f" after truncation to max_length={max_length}" if max_length else "")
        )
    inputs, targets = create_rightshifted_model_input_and_leftshifted_targets(chunks)
    is_image = _image_positions(chunks)[1:]
    target_weights = [0.0 if image else wt for wt, image in zip(w[1:], is_image, strict=True)]
    if reduction == "mean":
        total = sum(target_weights)
        if total <= 0:
            raise DataError("the sequence has no trainable tokens (all target weights are 0), so its mean is undefined")
        target_weights = [wt / total for wt in target_weights]
    return types.Datum(
        model_input=inputs,
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=targets, dtype="int64", shape=[len(targets)]),
            "weights": types.TensorData(data=target_weights, dtype="float32", shape=[len(target_weights)]),
        },
    )


def _to_numpy(values: types.TensorData | torch.Tensor | Sequence[float]) -> np.ndarray:
    if isinstance(values, types.TensorData):
        return values.to_numpy().astype(np.float64).reshape(-1)
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().double().numpy().reshape(-1)
    return np.asarray(values, dtype=np.float64).reshape(-1)


def compute_mean_nll(
    logprobs_list: Sequence[types.TensorData | torch.Tensor | Sequence[float]],
    weights_list: Sequence[types.TensorData | torch.Tensor | Sequence[float]],
) -> float:
    """``-sum(w * logp) / sum(w)`` over every token of every datum (NaN when no token has weight)."""
    if len(logprobs_list) != len(weights_list):
        raise ValueError(f"compute_mean_nll: {len(logprobs_list)} logprob arrays but {len(weights_list)} weight arrays")
    total_loss = 0.0
    total_weight = 0.0
    for logprobs, weights in zip(logprobs_list, weights_list, strict=True):
        lp, wt = _to_numpy(logprobs), _to_numpy(weights)
        if lp.shape != wt.shape:
            raise ValueError(f"compute_mean_nll: logprobs shape {lp.shape} != weights shape {wt.shape}")
        total_loss += float(-(lp * wt).sum())
        total_weight += float(wt.sum())
    return total_loss / total_weight if total_weight > 0 else float("nan")


def datum_weights(datum: types.Datum) -> types.TensorData:
    """The ``weights`` loss input of a datum."""
    return datum.loss_fn_inputs["weights"]


def count_loss_tokens(data: Sequence[types.Datum]) -> int:
    """Target positions with a non-zero weight (the tokens the batch trains on)."""
    return int(sum(int((datum_weights(d).to_numpy() != 0).sum()) for d in data))
