"""The per-snapshot decode batch of the sampler: K/V slot pool, token selection, stop detection.

Sequences of one weights snapshot share a slot-major K/V cache ``[layers, 2, slots, nkv, capacity, hd]``. Active
sequences always occupy slots ``0..n-1``: a finished sequence's slot is refilled by moving the last active sequence
into it, so a decode step never computes rows for finished sequences and never gathers the cache.

Token selection is batched over rows with per-row temperature / top-k / top-p and draws by inverse CDF from one
uniform number per row per step. The uniforms come from each sequence's own seeded generator, so a sequence's
tokens do not depend on which other sequences share its batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from tinker_cookbook.engine.sampling.decode import SharedPrompts
from tinker_cookbook.engine.sampling.decoder_model import DecoderSpec, top_columns
from tinker_cookbook.tinker import types

# Top-p first looks for the nucleus among this many most likely tokens and sorts the full vocabulary only for rows
# whose nucleus is wider (rare: flat distributions with top_p close to 1).
_NUCLEUS_CANDIDATES = 1024
# A cache is only shrunk when it holds more than four times this many (slot, position) pairs.
_MIN_SHRINK_ELEMENTS = 64 * 512


@dataclass(frozen=True)
class RowParams:
    """Sampling parameters of one sequence, already validated."""

    temperature: float
    top_k: int
    """0 means no limit."""

    top_p: float


@dataclass
class Sequence:
    """One sample being generated."""

    request: Any
    """The owning request (opaque to this module)."""

    index: int
    """Which of the request's samples this is."""

    params: RowParams
    rng: random.Random
    max_tokens: int
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    prompt_len: int
    rope_delta: int = 0
    """Rotary position minus cache position of generated tokens (negative after images in Qwen3-VL prompts)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt: PromptEntry | None = None
    """The prompt pool entry this sequence continues, while it is decoding."""

    @property
    def cached(self) -> int:
        """Tokens whose K/V are in the cache: the prompt and every generated token but the last."""
        return self.prompt_len + len(self.tokens) - 1

    @property
    def generated_cached(self) -> int:
        """Generated tokens whose K/V are in the sequence's own slot (its prompt's are in the prompt pool)."""
        return self.cached - self.prompt_len

    def next_uniform(self) -> float:
        return self.rng.random()


class KVPool:
    """Slot-major K/V cache ``[layers, 2, slots, nkv, capacity, hd]``, grown on demand.

    The sampler keeps two: one slot per decoding sequence for its generated tokens, and one slot per prompt being
    continued (``PromptPool``), shared by all of that prompt's samples.
    """

    def __init__(self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device):
        self.spec = spec
        self.dtype = dtype
        self.device = device
        self.cache: torch.Tensor | None = None

    @property
    def slots(self) -> int:
        return 0 if self.cache is None else self.cache.shape[2]

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else self.cache.shape[4]

    @property
    def num_bytes(self) -> int:
        return 0 if self.cache is None else self.cache.numel() * self.cache.element_size()

    def ensure(
        self, slots: int, length: int, *, used_slots: int, used_length: int, grows: bool = True
    ) -> None:
        """Make room for ``slots`` sequences of up to ``length`` positions, keeping the used region.

        Reallocates with headroom (25% more slots, 50% more positions, at least 16; ``grows=False``: positions
        only rounded up to 16, for contents that do not grow) so that a batch growing one sequence or one token at
        a time reallocates O(log n) times; and shrinks a cache four times larger than needed, so a long-lived
        batch does not keep the memory of its busiest moment.
        """
        needed = slots * length
        fits = slots <= self.slots and length <= self.capacity
        oversized = self.slots * self.capacity > 4 * max(needed, _MIN_SHRINK_ELEMENTS)
        if fits and not oversized:
            return
        new_slots = slots + slots // 4
        wanted = max(length + 16, length * 3 // 2) if grows else length
        new_length = min(-(-wanted // 16) * 16, self.spec.max_positions)
        spec = self.spec
        # Zeroed, not empty: attention reads masked positions too, and a NaN bit pattern there would poison it.
        cache = torch.zeros(
            spec.num_layers,
            2,
            new_slots,
            spec.num_kv_heads,
            new_length,
            spec.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        if self.cache is not None:
            keep_slots, keep_length = min(used_slots, self.slots, new_slots), min(used_length, self.capacity)
            cache[:, :, :keep_slots, :, :keep_length] = self.cache[:, :, :keep_slots, :, :keep_length]
        self.cache = cache

    def load(self, slot: int, kv: torch.Tensor) -> None:
        """Copy a prompt's K/V ``[layers, 2, nkv, len, hd]`` into ``slot``."""
        assert self.cache is not None
        self.cache[:, :, slot, :, : kv.shape[3]] = kv

    def move(self, source: int, target: int, length: int) -> None:
        assert self.cache is not None
        self.cache[:, :, target, :, :length] = self.cache[:, :, source, :, :length]

    def release(self) -> None:
        self.cache = None


@dataclass(eq=False)
class PromptEntry:
    """A prompt whose K/V are in the prompt pool, and how many decoding sequences continue it."""

    slot: int
    length: int
    key: Hashable
    """The prompt's identity (tokens and images): requests with the same key share this entry."""
    users: int = 0


class PromptPool:
    """The K/V of the prompts being continued, one slot per distinct prompt whatever its number of requests and
    samples.

    Slots stay dense (``0..len-1``): a released prompt's slot is refilled by the last one, whose entry is updated.
    """

    def __init__(self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device):
        self.kv = KVPool(spec, dtype, device)
        self.entries: list[PromptEntry] = []
        self.by_key: dict[Hashable, PromptEntry] = {}

    def add(self, kvs: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, PromptEntry]:
        """The entries of prompts ``{key: K/V [layers, 2, nkv, len, hd]}``; keys not stored yet are stored (one
        growth for all of them), the others keep their entry."""
        new = {key: kv for key, kv in kvs.items() if key not in self.by_key}
        if new:
            used_length = max((e.length for e in self.entries), default=0)
            length = max([used_length] + [kv.shape[3] for kv in new.values()])
            self.kv.ensure(
                len(self.entries) + len(new), length, used_slots=len(self.entries), used_length=used_length,
                grows=False,
            )
            for key, kv in new.items():
                entry = PromptEntry(slot=len(self.entries), length=kv.shape[3], key=key)
                self.kv.load(entry.slot, kv)
                self.entries.append(entry)
                self.by_key[key] = entry
        return {key: self.by_key[key] for key in kvs}

    def remove(self, entry: PromptEntry) -> None:
        """Free ``entry``'s slot (no sequence continues it any more)."""
        del self.by_key[entry.key]
        last = self.entries.pop()
        if last is not entry:
            self.kv.move(last.slot, entry.slot, last.length)
            last.slot = entry.slot
            self.entries[entry.slot] = last
        if not self.entries:
            self.kv.release()

    def shared(self, of_row: list[int]) -> SharedPrompts:
        """The view ``sampling.decode.decode`` reads, for sequences continuing the prompts in slots ``of_row``."""
        assert self.kv.cache is not None
        device = self.kv.device
        return SharedPrompts(
            cache=self.kv.cache,
            lengths=torch.tensor([e.length for e in self.entries], device=device),
            of_row=torch.tensor(of_row, device=device),
        )

    @property
    def num_bytes(self) -> int:
        return self.kv.num_bytes

    def release(self) -> None:
        self.entries = []
        self.by_key = {}
        self.kv.release()


# --------------------------------------------------------------------------------------------------------------
# Token selection
# --------------------------------------------------------------------------------------------------------------


def _block_size(width: int) -> int:
    """A block size that divides ``width`` if one of the usual ones does (no padding copy), else 256."""
    return next((b for b in (256, 128, 64) if width % b == 0), 256)


def _draw(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one column per row of non-negative, unnormalised ``weights``.

    Two levels (block sums, then one block) instead of a cumulative sum over the whole vocabulary: each full-width
    pass over ``[rows, vocab]`` costs milliseconds on CPU. The result depends only on the row itself.
    """
    rows, width = weights.shape
    size = _block_size(width)
    pad = -width % size
    padded = torch.nn.functional.pad(weights, (0, pad)) if pad else weights
    blocks = padded.view(rows, -1, size)
    block_sums = blocks.sum(dim=-1)
    cumulative = block_sums.cumsum(dim=-1)
    target = uniforms.to(cumulative.dtype) * cumulative[:, -1]
    block = torch.searchsorted(cumulative, target[:, None], right=True)[:, 0].clamp_(max=blocks.shape[1] - 1)
    row_index = torch.arange(rows, device=weights.device)
    remainder = target - (cumulative[row_index, block] - block_sums[row_index, block])
    within = blocks[row_index, block].cumsum(dim=-1)
    offset = torch.searchsorted(within, remainder[:, None], right=True)[:, 0].clamp_(max=size - 1)
    chosen = (block * size + offset).clamp_(max=width - 1)
    # Rounding at a block edge can land on a zero-weight column (a masked token or padding): take the row's best.
    zero = weights.gather(1, chosen[:, None])[:, 0] <= 0
    if bool(zero.any()):
        chosen[zero] = top_columns(weights[zero], 1)[:, 0]
    return chosen


def _truncated_draw(
    scaled: torch.Tensor, lse: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Draw from the top-k / nucleus of each row of ``scaled`` logits (rows with top_k 0 are unlimited)."""
    vocab = scaled.shape[-1]
    limit = torch.where(top_k > 0, top_k, vocab)
    needs_nucleus = top_p < 1.0
    width = int(limit.max())
    if bool(needs_nucleus.any()):
        width = min(width, _NUCLEUS_CANDIDATES)
    width = min(width, vocab)
    indices = top_columns(scaled, width)
    probs = torch.exp(scaled.gather(1, indices) - lse[:, None])
    # Rows whose nucleus may reach past the candidates: top_p not reached within them and no top_k cut before.
    short = needs_nucleus & (probs.sum(-1) < top_p) & (limit > width)
    if bool(short.any()):
        values, indices = scaled.sort(dim=-1, descending=True)
        probs = torch.exp(values - lse[:, None])
        width = vocab
    rank = torch.arange(width, device=scaled.device)[None, :]
    keep = rank < limit[:, None]
    before = probs.cumsum(-1) - probs
    # A token stays in the nucleus while the mass before it is below top_p (the most likely token always stays).
    keep &= before < top_p[:, None]
    keep[:, 0] = True
    choice = _draw(probs * keep, uniforms)
    return indices.gather(1, choice[:, None])[:, 0]


def select_tokens(
    logits: torch.Tensor,
    params: list[RowParams],
    uniforms: list[float],
    exact_logits: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
) -> tuple[list[int], list[float]]:
    """Pick one token per row; return the tokens and their logprobs under the temperature-scaled distribution.

    Temperature 0 is greedy (argmax) and reports the logprob under the unscaled (temperature 1) distribution.
    With top-k / top-p the draw is restricted to the kept tokens, and the logprob reported is still the one of the
    full temperature-scaled distribution (the quantity the docs define). ``exact_logits(tokens)``, when given and
    not None, is the fp32 logit of each row's chosen token, used for its logprob in place of the row's value in
    ``logits`` (which may be rounded).
    """
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    greedy = temperature == 0
    if all(p.temperature == 1.0 for p in params):
        scaled = logits
    else:
        scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    # logsumexp by hand: the exponentials are the sampling weights too, so the vocabulary is swept once.
    peak = scaled.amax(dim=-1, keepdim=True)
    weights = (scaled - peak).exp_()
    lse = peak[:, 0] + weights.sum(dim=-1).log()
    u = torch.tensor(uniforms, dtype=torch.float64, device=device)
    truncated = [p.temperature > 0 and (p.top_k > 0 or p.top_p < 1.0) for p in params]
    if not any(truncated) and not bool(greedy.any()):
        tokens = _draw(weights, u)
    else:
        tokens = top_columns(scaled, 1)[:, 0]
        plain = ~greedy & ~torch.tensor(truncated, device=device)
        if bool(plain.any()):
            rows = plain.nonzero()[:, 0]
            tokens[rows] = _draw(weights[rows], u[rows])
        if any(truncated):
            rows = torch.tensor([i for i, t in enumerate(truncated) if t], device=device)
            top_k = torch.tensor([params[i].top_k for i in rows.tolist()], device=device)
            top_p = torch.tensor([params[i].top_p for i in rows.tolist()], dtype=torch.float32, device=device)
            tokens[rows] = _truncated_draw(scaled[rows], lse[rows], top_k, top_p, u[rows])
    picked = scaled.gather(1, tokens[:, None])[:, 0]
    exact = exact_logits(tokens) if exact_logits is not None else None
    if exact is not None:
        picked = exact / torch.where(greedy, 1.0, temperature)
    logprobs = picked - lse
    return tokens.tolist(), logprobs.tolist()


Selected = tuple[int, float] | Exception
"""A row's token and logprob, or the error that row's selection raised."""


def select_tokens_per_owner(
    logits: torch.Tensor,
    params: list[RowParams],
    uniforms: list[float],
    owners: list[object],
    exact_logits: Callable[[torch.Tensor | slice, torch.Tensor], torch.Tensor | None] | None = None,
) -> list[Selected]:
    """``select_tokens`` over all rows; if that raises, once more for each owner's rows alone, so that a row no
    validation caught fails only its owner (a request) and never its batch neighbours.

    The retry reuses each row's uniform (draws stay reproducible under a seed) and gives the same result as the
    batched call, since a row's selection depends only on the row. ``exact_logits(rows, tokens)``: the fp32 logits
    of ``tokens`` for the rows ``rows`` (a slice of all rows, or an index tensor) when known, else None.
    """
    def run(rows: torch.Tensor | slice, sub_params: list[RowParams], sub_uniforms: list[float]
            ) -> list[Selected]:
        exact = None if exact_logits is None else (lambda chosen: exact_logits(rows, chosen))
        tokens, logprobs = select_tokens(logits[rows], sub_params, sub_uniforms, exact)
        return list(zip(tokens, logprobs, strict=True))

    try:
        return run(slice(None), params, uniforms)
    except Exception as error:  # noqa: BLE001 - decided below: one owner fails, or each is retried alone
        batch_error: Exception = error
    groups: dict[int, list[int]] = {}
    for row, owner in enumerate(owners):
        groups.setdefault(id(owner), []).append(row)
    if len(groups) == 1:
        return [batch_error] * len(params)
    results: list[Selected] = [batch_error] * len(params)
    for rows in groups.values():
        index = torch.tensor(rows, device=logits.device)
        try:
            selected = run(index, [params[r] for r in rows], [uniforms[r] for r in rows])
        except Exception as own_error:  # noqa: BLE001 - this owner's rows fail, the others' stand
            selected = [own_error] * len(rows)
        for row, value in zip(rows, selected, strict=True):
            results[row] = value
    return results


# --------------------------------------------------------------------------------------------------------------
# Stops
# --------------------------------------------------------------------------------------------------------------


def stop_window(stop_strings: tuple[str, ...]) -> int:
    """How many trailing tokens always cover a stop string: a token holds at least one byte, a char at most 4."""
    return 4 * max((len(s) for s in stop_strings), default=0) + 2


def finish_reason(sequence: Sequence, tokenizer: Any) -> types.StopReason | None:
    """``"stop"``/``"length"`` when ``sequence`` must end after its latest token, else None.

    Stop strings are searched in the decoded text of the latest generated tokens (never the prompt), so a stop
    string split over several tokens is found at the token that completes it; that token is kept.
    """
    token = sequence.tokens[-1]
    if token in sequence.stop_token_ids:
        return "stop"
    if sequence.stop_strings:
        window = sequence.tokens[-stop_window(sequence.stop_strings) :]
        text = tokenizer.decode(window, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if any(stop in text for stop in sequence.stop_strings):
            return "stop"
    if len(sequence.tokens) >= sequence.max_tokens:
        return "length"
    return None
