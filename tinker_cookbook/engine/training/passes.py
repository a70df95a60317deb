"""One training pass's building blocks: which rows run together, the decoder's hidden states of a padded batch
(a shared prefix once), and the target tokens' logprobs from the unembedding in chunks.

Also the rule for a shared prefix that the sampler's prefill uses too (``shared_prefix_length``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tinker_cookbook.engine.training import fused_layers

LOGPROB_CHUNK_TOKENS = 256
"""Target positions per unembedding chunk: each chunk's fp32 logits ([chunk, vocabulary]) exist only while its loss
is backpropagated, so the full-vocabulary logits of a batch never exist at once. ``logprob_chunk_tokens`` may pick
``CACHED_CHUNK_TOKENS`` instead on a CPU."""
CACHED_CHUNK_TOKENS = 128
"""The chunk on a CPU whose last-level cache holds that many rows of fp32 logits (with room to spare, see
``logprob_chunk_tokens``). A chunk's logits are swept five times after the matmul writes them (LoRA's add,
log-softmax's maximum, sum and write, the backward's softmax in place) and read by the three backward matmuls; when
they stay in the cache those sweeps stop going to memory. Measured on SmolLM2-135M's head (vocabulary 49152, hidden
576, LoRA r32, forward + backward of 2048 tokens, one thread, 32 MiB L3): 128 rows 1.66-1.70 s, 160 1.64, 192 1.90,
256 2.00-2.07, 64 1.76-1.80; two threads: 128 0.96 s against 1.16 for 256. With a vocabulary too large for the
cache (Qwen3's 151936, hidden 1024) smaller chunks only lose matmul efficiency: 256 rows 2.35 s, 128 2.48, 32 2.56
per 1024 tokens (two threads), so 256 stays there."""
CACHE_FILL = 0.8
"""The share of the last-level cache a chunk's logits may take (the weights and gradients stream through it too)."""
PACK_MIN_ROW_TOKENS = 128
"""Length groups whose rows all have at least this many tokens run packed, without padding (``packable``); their
attention is computed row by row then. Shorter rows keep the right-padded batch, whose attention serves several
rows in each batched matmul (RL's many short rollouts)."""
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
"""Where Linux describes the first CPU's caches (``index*/size``, e.g. ``32768K``)."""
GROUP_MAX_TOKENS = 2048
GROUP_MAX_PAD_FRACTION = 0.15
MIN_SHARED_PREFIX = 16
"""Rows (training) or prompts (the sampler's prefill) that start with at least this many equal tokens compute that
prefix once: in RL every sample of a prompt, and often every prompt of a batch (a system prompt, few-shot
examples), starts the same way."""


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """The tokens all ``rows`` start with (each keeping at least one of its own: its last position's output is
    computed with it), if at least ``MIN_SHARED_PREFIX`` and there are several rows; else 0."""
    if len(rows) < 2:
        return 0
    limit = min(len(r) for r in rows) - 1
    length = 0
    first = rows[0]
    while length < limit and all(r[length] == first[length] for r in rows):
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0


def length_groups(lengths: list[int], max_tokens: int = GROUP_MAX_TOKENS) -> list[list[int]]:
    """Indices grouped for padded batches: similar lengths together, padding and size bounded.

    Many short sequences (RL rollouts) run far faster as one batch than one by one on a CPU, while mixing very
    different lengths would spend compute on padding; a group grows (in length order) while its padded size stays
    within ``max_tokens`` and padding within GROUP_MAX_PAD_FRACTION of it.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        candidate = [*current, index]
        padded = lengths[index] * len(candidate)
        real = sum(lengths[i] for i in candidate)
        if current and (padded > max_tokens or padded - real > GROUP_MAX_PAD_FRACTION * padded):
            groups.append(current)
            candidate = [index]
        current = candidate
    if current:
        groups.append(current)
    return groups


def largest_first(groups: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """``groups`` (of indices into ``lengths``), the largest padded size first (stable among equal sizes): the order
    a training pass runs its groups in.

    The heap a pass allocates from keeps what it once held (the engine's malloc settings keep freed memory for
    reuse), so a step's peak RSS is the high-water mark of its largest group plus whatever lay above it. Run
    smallest first, each larger group lays its activations out around what the earlier ones left behind (the
    gradients first created in their backward, their outputs) and raises the mark again, and the largest one runs
    with the gradients already allocated; run first, it sets the mark once and the smaller groups fit under it.
    Measured on SmolLM2-135M with a mixed pass (4 clients x 4 rows of 64-512 tokens, ``multi_client``): peak RSS
    4.72 -> 4.16 GiB, the largest group's peak of live bytes 3.31 -> 2.95 GB.
    """
    return sorted(groups, key=lambda group: -len(group) * max(lengths[i] for i in group))


def largest_group_tokens(lengths: list[int]) -> int:
    """The padded size (rows x longest row) of the largest group ``length_groups(lengths)`` makes."""
    return max(len(group) * max(lengths[i] for i in group) for group in length_groups(lengths))


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The CPU's largest cache in bytes, as Linux reports it (None where it does not); read once per process."""
    sizes = []
    for entry in CPU_CACHE_DIR.glob("index*/size"):
        try:
            text = entry.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def logprob_chunk_tokens(vocab_size: int, device: torch.device, cache_bytes: int | None = None) -> int:
    """Target positions per unembedding chunk for this vocabulary and device: ``CACHED_CHUNK_TOKENS`` on a CPU whose
    last-level cache (``cache_bytes``, read from the system when None) holds that many rows of fp32 logits within
    ``CACHE_FILL``, else ``LOGPROB_CHUNK_TOKENS``. Logprobs are the same either way (each position's are computed
    once, from its own logits); only speed and the transient memory change."""
    if device.type != "cpu":
        return LOGPROB_CHUNK_TOKENS
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    if cache is not None and CACHED_CHUNK_TOKENS * vocab_size * 4 <= CACHE_FILL * cache:
        return CACHED_CHUNK_TOKENS
    return LOGPROB_CHUNK_TOKENS


def packable(lengths: Sequence[int]) -> bool:
    """Whether a length group runs as its rows packed end to end (``packed_hidden``) rather than right-padded: rows
    of unequal lengths (else nothing is padded), each at least ``PACK_MIN_ROW_TOKENS`` long."""
    return len(lengths) > 1 and min(lengths) >= PACK_MIN_ROW_TOKENS and min(lengths) != max(lengths)


def packed_hidden(model: Any, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """The decoder's final hidden states of ``rows`` packed into one sequence, ``[1, Σ len, hidden]``.

    Each row keeps its own positions (from 0), and attention stays within each row: transformers reads the
    restarting positions as packed sequences and masks across them, and ``fused_layers.packed_rows`` has the fused
    attention compute each row's causal attention on its own. Same values as a right-padded batch of the rows, to
    fp32 rounding (the matmuls see another row count); no padding position is computed.
    """
    ids = torch.cat(list(rows))[None]
    positions = torch.cat([torch.arange(len(row), device=ids.device) for row in rows])[None]
    with fused_layers.packed_rows([len(row) for row in rows]):
        return model.model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state


def decoder_hidden(model: Any, ids: torch.Tensor, shared: int) -> torch.Tensor:
    """The decoder's final hidden states of the right-padded rows ``ids``, their first ``shared`` tokens equal.

    The shared prefix runs once, with its K/V cache kept in the graph; the cache is repeated for every row and the
    rows' own tokens attend to it. Same values as one pass over the full rows (causal attention: a prefix token
    never sees what follows it), to fp32 rounding; the backward sums each row's gradient into the one prefix.
    """
    if shared == 0:
        return model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    prefix = model.model(input_ids=ids[:1, :shared], use_cache=True)
    cache = prefix.cache
    cache.batch_repeat_interleave(ids.shape[0])
    rest = model.model(input_ids=ids[:, shared:], cache=cache, use_cache=True).last_hidden_state
    return torch.cat([prefix.last_hidden_state.expand(ids.shape[0], -1, -1), rest], dim=1)


def reached_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                      reach: torch.Tensor | None) -> torch.Tensor:
    """``chunk_logprobs`` whose graph covers only the ``reach`` positions (None: all); the rest are constants.

    Each position's logits are computed once: the unreached ones without a graph, the reached ones with it.
    """
    if reach is None or bool(reach.all()):
        return chunk_logprobs(head, hidden, targets)
    if not bool(reach.any()):
        with torch.no_grad():
            return chunk_logprobs(head, hidden, targets)
    on, off = reach.nonzero().squeeze(-1), (~reach).nonzero().squeeze(-1)
    with torch.no_grad():
        constant = chunk_logprobs(head, hidden[off], targets[off])
    reached = chunk_logprobs(head, hidden[on], targets[on])
    # Out of place, so that autograd sees the reached values (and their graph) land at their positions.
    logp = torch.zeros(targets.shape, dtype=constant.dtype, device=constant.device)
    return logp.index_copy(0, off, constant).index_copy(0, on, reached)


def chunk_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Logprobs of ``targets`` (shape [s], or [s, k] for k candidates per position), shaped like ``targets``."""
    logits = head(hidden).float()
    index = targets if targets.dim() == 2 else targets[:, None]
    logp = TargetLogprobs.apply(logits, index, True)  # a single backward: it may reuse the saved buffer
    return logp if targets.dim() == 2 else logp.squeeze(-1)


class TargetLogprobs(torch.autograd.Function):
    """``log_softmax(logits).gather(-1, index)``, with a backward that makes no new vocabulary-wide tensor.

    The forward is torch's fused log-softmax kernel (one sweep for the maximum, one for the sum of exponentials,
    one writing ``x - max - log(sum)``): ``logits.gather - logsumexp(logits)`` sweeps more (logsumexp writes
    ``x - max`` and then its exponential into a temporary of the logits' size) and took twice as long on a
    [256, 49152] chunk. The backward ``scatter(g) - softmax · sum(g)`` (the gradient of autograd's ops, to fp32
    rounding) is built in the saved log-softmax's own buffer, in place (``exp_``), with ``consume``; else in a new
    one (a second backward through a retained graph then still sees the log-softmax).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, index: torch.Tensor,  # type: ignore[override]
                consume: bool = False) -> torch.Tensor:
        ctx.consume = consume
        logp = torch.log_softmax(logits, dim=-1)
        ctx.save_for_backward(logp, index)
        return logp.gather(-1, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        logp, index = ctx.saved_tensors
        out = logp.exp_() if ctx.consume else torch.exp(logp)  # the softmax
        out.mul_(grad.sum(dim=-1, keepdim=True).neg_())
        return out.scatter_add_(-1, index, grad), None, None
