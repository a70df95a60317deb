"""One training pass: logprobs of each datum's targets through the decoder and the head, and the backward of
their token losses, for a group of rows (``run_group``) or a whole request's batch (``run_batch``).

Memory: a sequence's logprobs are computed from the final hidden states in token chunks, each chunk's loss
backpropagated to the hidden states before the next chunk's logits exist, so full-vocabulary fp32 logits (and
their gradients) never exist for more than one chunk at once. Sequences of similar length run together as one
right-padded batch, with padding bounded to a small fraction; long rows of unequal lengths run packed end to end
instead, without padding.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tinker_cookbook.engine import vision
from tinker_cookbook.engine.device import fast_fp32_matmuls
from tinker_cookbook.engine.training import multi_lora, passes
from tinker_cookbook.engine.training.validation import DatumTensors
from tinker_cookbook.tinker.errors import UnprocessableEntityError

if TYPE_CHECKING:
    from tinker_cookbook.engine.training.base_model import BaseModel


@dataclass(frozen=True)
class TokenLoss:
    """One datum's loss, a sum of per-token terms: ``fn(logprobs of a span of tokens, that span)`` -> their loss.

    ``reach`` (bool ``[n]``, or None for all): the positions where the gradient can be non-zero. The others'
    logprobs are computed without a graph, so the unembedding's backward (a vocabulary-wide matmul per position)
    skips them; the gradient is the same, because there it is exactly 0.
    """

    fn: Callable[[torch.Tensor, slice], torch.Tensor]
    reach: torch.Tensor | None = None


def run_group(base: BaseModel, model: Any, items: list[DatumTensors], token_losses: list[TokenLoss] | None,
              row_adapters: list[str] | None = None) -> tuple[list[torch.Tensor], list[float]]:
    """Logprobs of each item's targets (and, with ``token_losses``, backpropagate them); one pass.

    Items are right-padded into one batch. Under causal attention a real token only sees earlier, real
    tokens, so padding at the end changes nothing for them and needs no attention mask. Long rows of unequal
    lengths run packed end to end instead, without padding (``passes.packable``). The head then runs
    row by row, chunk by chunk, on a detached copy of the hidden states: each chunk's logits live only while
    that chunk's loss is backpropagated into the hidden states, which finally flow through the decoder in one
    backward. Exact because every loss here is a sum of per-token terms; no logits are recomputed.

    ``row_adapters`` (a mixed pass, inside ``multi_lora.no_active_adapter``): the adapter of each row, equal
    names contiguous; rows then use their own adapter, in the decoder and in the head. None: the active one.
    """
    grad = token_losses is not None
    width = max(len(item.input_ids) for item in items)
    ids = torch.zeros(len(items), width, dtype=torch.long, device=base.device)
    for row, item in enumerate(items):
        ids[row, : len(item.input_ids)] = item.input_ids
    images = [image for item in items for image in item.images]
    lengths = [len(item.input_ids) for item in items]
    shared, packed = 0, False
    with torch.set_grad_enabled(grad), base.autocast():
        if images:
            hidden = vision.language_hidden(model, ids, images)
        elif row_adapters is not None:
            with multi_lora.row_segments(base.lora_layers(), _segments(row_adapters)):
                hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        else:
            # The general path runs each row whole: its caches (sliding windows, latent attention) are the model's.
            shared = 0 if base.is_vision or base.general else passes.shared_prefix_length([item.input_ids.tolist() for item in items])
            packed = shared == 0 and base.packs_rows and passes.packable(lengths)
            hidden = (passes.packed_hidden(model, [item.input_ids.to(ids.device) for item in items]) if packed
                      else passes.decoder_hidden(model, ids, shared))
    base.decoder_positions += sum(lengths) if packed else ids.numel() - (len(items) - 1) * shared
    # The unembedding and log-softmax run in fp32 outside autocast: logprobs are what the losses and RL's
    # importance ratios compare, so they get full precision whatever the decoder's.
    leaf = hidden.detach().float().requires_grad_(grad and hidden.requires_grad)
    head = model.get_output_embeddings()
    chunk = passes.logprob_chunk_tokens(head.weight.shape[0], leaf.device)
    logps, totals = [], []
    starts = [0, *itertools.accumulate(lengths)]
    for row, item in enumerate(items):
        row_hidden = leaf[0, starts[row]:starts[row] + lengths[row]] if packed else leaf[row]
        targets, pieces, total = item.inputs["target_tokens"], [], 0.0
        row_head = head if row_adapters is None else multi_lora.with_adapter(head, row_adapters[row])
        for start in range(0, len(targets), chunk):
            span = slice(start, min(start + chunk, len(targets)))
            with torch.set_grad_enabled(grad):
                if token_losses is None:
                    logp = passes.chunk_logprobs(row_head, row_hidden[span], targets[span])
                else:
                    reach = token_losses[row].reach
                    logp = passes.reached_logprobs(row_head, row_hidden[span], targets[span],
                                             None if reach is None else reach[span])
                    loss = token_losses[row].fn(logp, span)
                    if loss.requires_grad:
                        loss.backward()
                    total += float(loss.detach())
            pieces.append(logp.detach())
        logps.append(torch.cat(pieces))
        totals.append(total)
    if grad and leaf.grad is not None:
        hidden.backward(leaf.grad.to(hidden.dtype))
    return logps, totals



def run_batch(base: BaseModel, run_id: str, params: dict[str, torch.nn.Parameter], model: Any,
              batch: list[DatumTensors], token_losses: list[TokenLoss] | None
              ) -> tuple[list[torch.Tensor], list[float]]:
    """``run_group`` over groups of similar-length items of one adapter (``run_id``, its trainable ``params``),
    results in the original order."""
    logps: list[torch.Tensor] = [torch.empty(0)] * len(batch)
    totals = [0.0] * len(batch)
    # The adapter's deltas through multi_lora's fused add where it reproduces peft (text rows, plain LoRA).
    layers = base.lora_layers()
    fused = not any(item.images for item in batch) and multi_lora.supports(layers, [run_id])
    with multi_lora.one_adapter(layers, run_id, params) if fused else contextlib.nullcontext():
        lengths = [len(item.input_ids) for item in batch]
        for group in passes.largest_first(passes.length_groups(lengths), lengths):
            group_losses = [token_losses[i] for i in group] if token_losses is not None else None
            with fast_fp32_matmuls(base.device):
                group_logps, group_totals = run_group(base, model, [batch[i] for i in group], group_losses)
            for i, logp, total in zip(group, group_logps, group_totals, strict=True):
                logps[i], totals[i] = logp, total
    return logps, totals



def check_losses_finite(totals: list[float]) -> None:
    bad = [i for i, total in enumerate(totals) if not math.isfinite(total)]
    if bad:
        raise UnprocessableEntityError(
            f"forward_backward refused: the loss of data[{bad[0]}] is {totals[bad[0]]} ({len(bad)} of {len(totals)} "
            "data overflow float32); nothing was accumulated. Scale its weights/advantages down"
        )




def _segments(row_adapters: list[str]) -> list[tuple[str, int]]:
    """Runs of equal names: [a, a, b] -> [(a, 2), (b, 1)]."""
    segments: list[tuple[str, int]] = []
    for name in row_adapters:
        if segments and segments[-1][0] == name:
            segments[-1] = (name, segments[-1][1] + 1)
        else:
            segments.append((name, 1))
    return segments


