"""One sampler decode step: a token for each of ``n`` sequences against the K/V cache (see ``sampling.decoder_model``).

Sequences read their prompt's K/V where the prompt pool stores it once for all its samples (``SharedPrompts``) and
their own generated positions from their cache slot. On CPU in fp32 the step's element-wise work runs in the
compiled ``decode_kernel``; this module's torch version runs elsewhere (GPU, bf16, no C compiler) and is the
reference the kernel is tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tinker_cookbook.engine.kernels import decode_kernel
from tinker_cookbook.engine.sampling.decoder_model import (
    DecoderWeights,
    as_fp32,
    attention_inputs,
    finish_layer,
)


@dataclass
class SharedPrompts:
    """The prompts' K/V, stored once per prompt and read by every sequence that continues it.

    ``cache`` is ``[layers, 2, prompts, nkv, capacity, hd]``; prompt ``j`` holds ``lengths[j]`` positions; sequence
    ``i`` of a decode step continues prompt ``of_row[i]`` and keeps only its generated tokens in its own slot.
    """

    cache: torch.Tensor
    lengths: torch.Tensor
    of_row: torch.Tensor


@dataclass
class _PromptGroups:
    """The decode rows grouped by prompt, padded to the largest group (pads repeat row 0 and are never read)."""

    prompts: torch.Tensor | None
    """The prompt slots in use this step, or None when they are slots ``0..count-1`` (read as a slice, no copy)."""

    size: int
    """Rows per group after padding."""

    padded: torch.Tensor
    """[groups * size]: the row at each padded position."""

    position: torch.Tensor
    """[n]: each row's padded position."""

    bias: torch.Tensor | None
    """[groups, 1, 1, prompt_len]: 0 at a prompt's positions, -inf past its end; None when all prompts in use
    have the same length (nothing to mask: adding zeros would change no score)."""

    count: int
    """Prompts in use."""

    length: int
    """The longest prompt in use: how many cached positions are read."""

    identity: bool
    """Row ``i`` is the only one continuing the ``i``-th prompt in use (e.g. batch 1): rows need no regrouping."""


def _group_rows(shared: SharedPrompts) -> _PromptGroups:
    of_row = shared.of_row
    device = of_row.device
    if of_row.shape[0] == 1:  # one sequence (batch-1 decode): no grouping, ~15 torch calls fewer per step
        slot = int(of_row[0])
        first = torch.zeros(1, dtype=torch.long, device=device)
        return _PromptGroups(
            prompts=None if slot == 0 else of_row,
            size=1,
            padded=first,
            position=first,
            bias=None,
            count=1,
            length=int(shared.lengths[slot]),
            identity=True,
        )
    used, group = torch.unique(of_row, return_inverse=True)  # group: [n], the index of each row's prompt in used
    count = used.shape[0]
    order = torch.argsort(group, stable=True)
    sizes = torch.bincount(group, minlength=count)
    size = int(sizes.max())
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0], device=device) - starts[group[order]]
    position = group * size + rank
    padded = torch.zeros(count * size, dtype=torch.long, device=device)
    padded[position] = torch.arange(of_row.shape[0], device=device)
    lengths = shared.lengths[used]
    length = int(lengths.max())
    bias = None
    if int(lengths.min()) < length:
        past = torch.arange(length, device=device)[None, :] >= lengths[:, None]
        bias = torch.zeros(past.shape, dtype=torch.float32, device=device).masked_fill_(past, -math.inf)[:, None, None]
    dense = int(used[-1]) == count - 1  # used is sorted and distinct: then it is 0..count-1
    identity = size == 1 and bool((group == torch.arange(group.shape[0], device=device)).all())
    return _PromptGroups(
        prompts=None if dense else used,
        size=size,
        padded=padded,
        position=position,
        bias=bias,
        count=count,
        length=length,
        identity=identity,
    )


def _decode_rope(weights: DecoderWeights, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed-sin ``[n, heads + kv heads, hd]`` at positions ``rope [n]``, the query heads' scaled by the
    attention scale ``hd^-0.5``.

    Scaling q once here (RoPE is linear) spares a multiplication of the scores in every layer. With a
    power-of-two scale (head_dim 64, 256) the scores are bit for bit those of scaling after the product;
    otherwise they differ by fp32 rounding (~1e-7 relative).
    """
    spec = weights.spec
    cos_table, sin_table = weights.rope_tables(int(rope.max()) + 1)
    scale = torch.ones(spec.num_heads + spec.num_kv_heads, 1, device=rope.device)
    scale[: spec.num_heads] = spec.head_dim**-0.5
    return cos_table[rope][:, None, :] * scale, sin_table[rope][:, None, :] * scale


@torch.inference_mode()
def decode(
    weights: DecoderWeights,
    cache: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    attend_len: int,
    shared: SharedPrompts | None = None,
    rope_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step for sequences in cache slots ``0..n-1``; returns final hidden states ``[n, H]``.

    ``cache`` is ``[layers, 2, slots, nkv, capacity, hd]``; sequence ``i`` is at position ``positions[i]`` and its
    new K/V are written at ``positions[i]`` of its slot, or at ``positions[i] - prompt length`` with ``shared``
    prompts (the slot then holds only generated tokens). Attention reads the first ``attend_len`` positions of
    every slot, masked per sequence, and with ``shared`` prompts the sequence's prompt first. ``rope_positions``
    are the rotary positions when they differ from ``positions`` (tokens after images in Qwen3-VL).

    A batch-1 step is hundreds of small torch calls, each costing microseconds: whatever does not depend on the
    layer (cache views, masks, rotary tables) is made once per step, and masks that mask nothing are skipped.
    """
    if decode_kernel.usable(weights) and decode_kernel.accepts(cache, shared):
        return decode_kernel.decode(weights, cache, tokens, positions, shared, rope_positions)
    spec = weights.spec
    n = tokens.shape[0]
    cos, sin = _decode_rope(weights, positions if rope_positions is None else rope_positions)
    local = positions if shared is None else positions - shared.lengths[shared.of_row]
    groups = None if shared is None else _group_rows(shared)
    layers, _, slots, heads, capacity, head_dim = cache.shape
    # Row (slot i, head j, position p) of a layer's K (or V) viewed as [slots * heads * capacity, head_dim]:
    # index_copy_ of whole rows is much cheaper than advanced-index assignment into the 4-d view.
    rows = torch.arange(n, device=tokens.device)[:, None] * heads + torch.arange(heads, device=tokens.device)
    rows = (rows * capacity + local[:, None]).reshape(-1)
    # The same rows in the V half of a layer's [2, slots, heads, capacity, hd] block: K and V written in one copy.
    rows = torch.cat([rows, rows + slots * heads * capacity])
    # Additive mask [n, 1, 1, attend_len]: 0 where sequence i has a cached position, -inf beyond it. A single
    # sequence attending to exactly its positions needs none.
    bias = None
    if n > 1 or int(local[0]) != attend_len - 1:
        beyond = torch.arange(attend_len, device=tokens.device)[None, :] > local[:, None]
        bias = torch.zeros(beyond.shape, dtype=torch.float32, device=tokens.device).masked_fill_(beyond, -math.inf)
        bias = bias[:, None, None, :]
    # Per-layer views, made once: the K/V rows written, the keys (transposed for the score product) and values read.
    flat = cache.view(layers, -1, head_dim).unbind(0)
    own_keys = cache[:, 0, :n, :, :attend_len].transpose(-1, -2).unbind(0)
    own_values = cache[:, 1, :n, :, :attend_len].unbind(0)
    prompt_keys: tuple[torch.Tensor, ...] = ()
    prompt_values: tuple[torch.Tensor, ...] = ()
    if shared is not None and groups is not None:
        prompts = shared.cache[:, :, :, :, : groups.length]
        if groups.prompts is None:
            prompts = prompts[:, :, : groups.count]
        else:
            prompts = prompts.index_select(2, groups.prompts)
        prompt_keys = prompts[:, 0].transpose(-1, -2).unbind(0)
        prompt_values = prompts[:, 1].unbind(0)
    h = weights.embed[tokens].float()
    for index, layer in enumerate(weights.layers):
        q, k, v = attention_inputs(weights, layer, h, cos, sin)
        new = torch.stack((k, v)).view(-1, head_dim)
        flat[index].index_copy_(0, rows, new if new.dtype == cache.dtype else new.to(cache.dtype))
        if groups is None:
            out = _decode_attention(q, own_keys[index], own_values[index], bias)
        else:
            out = _shared_decode_attention(
                q, own_keys[index], own_values[index], bias, prompt_keys[index], prompt_values[index], groups
            )
        h = finish_layer(layer, h, out, spec.rms_eps)
    return h


def _decode_attention(
    q: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Attention of one query per sequence, all in fp32: ``q [n, nh, hd]`` (scaled by ``hd^-0.5``),
    ``keys_t [n, nkv, hd, L]`` (transposed), ``values [n, nkv, L, hd]``, ``bias`` None or ``[n, 1, 1, L]``.

    The same arithmetic as prefill (fp32 scores, softmax and weighted sum over K/V as stored in the cache), as two
    batched matmuls. SDPA's CPU kernel is built for long queries: with one query row per sequence and a mask it
    spent 2/3 of a decode step here.
    """
    n, num_heads, head_dim = q.shape
    num_kv = keys_t.shape[1]
    grouped = q.view(n, num_kv, num_heads // num_kv, head_dim)  # the query heads sharing each K/V head
    scores = torch.matmul(grouped, as_fp32(keys_t))
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(scores.softmax(-1), as_fp32(values)).reshape(n, num_heads * head_dim)


def _shared_decode_attention(
    q: torch.Tensor,
    keys_t: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None,
    prompt_keys_t: torch.Tensor,
    prompt_values: torch.Tensor,
    groups: _PromptGroups,
) -> torch.Tensor:
    """``_decode_attention`` over each sequence's prompt (``prompt_keys_t [groups, nkv, hd, P]``, transposed) then
    its own K/V.

    One softmax over both parts; the prompt part is computed per group, all sequences of a prompt against its K/V
    in one matmul, so a prompt's K/V are stored and read once for all its samples.
    """
    n, num_heads, head_dim = q.shape
    num_kv = keys_t.shape[1]
    per_kv = num_heads // num_kv
    count, size, length = groups.count, groups.size, groups.length

    def to_groups(x: torch.Tensor) -> torch.Tensor:  # [n, nkv, per_kv, X] -> [groups, nkv, size * per_kv, X]
        if groups.identity:
            return x
        x = x[groups.padded].view(count, size, num_kv, per_kv, -1)
        return x.transpose(1, 2).reshape(count, num_kv, size * per_kv, -1)

    def to_rows(x: torch.Tensor) -> torch.Tensor:  # the inverse of to_groups
        if groups.identity:
            return x
        x = x.view(count, num_kv, size, per_kv, -1).transpose(1, 2).reshape(count * size, num_kv, per_kv, -1)
        return x[groups.position]

    grouped = q.view(n, num_kv, per_kv, head_dim)
    prompt_scores = torch.matmul(to_groups(grouped), as_fp32(prompt_keys_t))
    if groups.bias is not None:
        prompt_scores.add_(groups.bias)
    own_scores = torch.matmul(grouped, as_fp32(keys_t))
    if bias is not None:
        own_scores.add_(bias)
    probs = torch.cat([to_rows(prompt_scores), own_scores], dim=-1).softmax(-1)
    out = torch.matmul(probs.narrow(-1, length, probs.shape[-1] - length), as_fp32(values))
    out += to_rows(torch.matmul(to_groups(probs.narrow(-1, 0, length)), as_fp32(prompt_values)))
    return out.reshape(n, num_heads * head_dim)
