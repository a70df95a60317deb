"""The work of one decoder's batch at each worker step (``DecoderBatch.step``): admit waiting requests and
prefill their prompts (``prefill``), place their samples in cache slots, and decode one token for every active
sequence; finished sequences leave at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import random
import secrets
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tinker_cookbook.engine.sampling import decode as sampling_decode
from tinker_cookbook.engine.sampling import decoder_model, lora, prefill
from tinker_cookbook.engine.sampling.batch import (
    KVPool,
    PromptPool,
    Selected,
    Sequence,
    finish_reason,
    select_tokens_per_owner,
)
from tinker_cookbook.engine.sampling.requests import SampleRequest
from tinker_cookbook.engine.threads import LocalThreads
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import RequestFailedError

if TYPE_CHECKING:
    from tinker_cookbook.engine.sampling.weights import SamplingWeights

PromptKey = tuple[tuple[int, ...], Hashable, Hashable]
"""A prompt's tokens, the key of its images and the snapshot's unmerged adapter (by identity): requests with equal
keys have the same prompt K/V."""
# A decode step over at most this many activation elements (rows x hidden size) runs on one CPU thread: its
# hundreds of small ops each cost more in OpenMP fork/join than a second thread saves (SmolLM2-135M, 2 idle cores:
# 1, 4 and 16 rows decode 1.4x, 1.4x and 1.03x faster on one thread). Prefill and larger steps use all threads.
_ONE_THREAD_DECODE_ELEMENTS = 16 * 576


@dataclass(frozen=True)
class BatchLimits:
    max_batch_sequences: int
    """The most sequences one decode step advances."""
    prefill_token_budget: int
    """Prompt tokens packed into one prefill forward; more waits for the next step (bounds activation memory)."""


@dataclass
class SamplerStats:
    """Counters of one engine (a snapshot copy)."""

    requests_completed: int = 0
    requests_failed: int = 0
    sequences_completed: int = 0
    tokens_generated: int = 0
    decode_steps: int = 0
    prefill_forwards: int = 0
    prompts_prefilled: int = 0
    """Distinct prompts run through prefill (requests with the same prompt in one prefill share it)."""

    prefill_tokens: int = 0
    max_batch_sequences_seen: int = 0
    """The most sequences advanced by a single decode step: > 1 shows that requests were batched together."""

    max_prompts_per_prefill: int = 0
    peak_kv_bytes: int = 0
    """The most memory the K/V caches (per-sequence slots and shared prompts, all snapshots) held at once."""



class PendingRequest:
    """A request in flight: its validated fields, its samples so far, its future."""

    def __init__(self, weights: SamplingWeights, tokenizer: Any, spec: SampleRequest):
        self.weights = weights
        self.tokenizer = tokenizer
        self.spec = spec
        self.future: concurrent.futures.Future[types.SampleResponse] = concurrent.futures.Future()
        self.results: list[types.SampledSequence | None] = [None] * spec.num_samples
        self.remaining = spec.num_samples
        self.unplaced = 0
        self.kv: torch.Tensor | None = None
        """The prefilled prompt K/V while some samples wait for a slot."""

        self.prompt_key: PromptKey = (
            tuple(spec.prompt), spec.vision.key if spec.vision is not None else (), weights.adapter
        )
        """Tokens, images and adapter: requests with equal keys have the same prompt K/V (prefilled and stored
        once)."""
        self.prompt_logprobs: list[float | None] | None = None
        self.topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = None

    @property
    def done(self) -> bool:
        return self.future.done()

    def sample_rngs(self) -> list[random.Random]:
        """One generator per sample; seeded requests derive them from the seed alone (reproducible)."""
        seed = self.spec.seed
        source = random.Random(f"tinker-cookbook-sampler:{seed}") if seed is not None else None
        bits = [
            source.getrandbits(64) if source else secrets.randbits(64) for _ in range(self.spec.num_samples)
        ]
        return [random.Random(b) for b in bits]

    def fail(self, error: BaseException, stats: SamplerStats) -> None:
        """Fail the request (unless it is done): a RequestFailedError, the cause chained."""
        if self.done:
            return
        stats.requests_failed += 1
        if not isinstance(error, RequestFailedError):
            wrapped = RequestFailedError(f"sampling failed: {type(error).__name__}: {error}")
            wrapped.__cause__ = error
            error = wrapped
        settle(self.future, error=error)


class DecoderBatch:
    """Requests and sequences of one decoder: a merged snapshot, or a base and its unmerged snapshots."""

    def __init__(self, decoder: decoder_model.DecoderWeights, limits: BatchLimits, stats: SamplerStats,
                 threads: LocalThreads | None) -> None:
        self.decoder = decoder
        self.limits = limits
        self.stats = stats
        self.threads = threads
        """The worker's own torch thread count (``_use_threads``); None: leave it alone."""
        dtype = decoder_model.kv_cache_dtype(decoder)
        self.pool = KVPool(decoder.spec, dtype, decoder.device)
        """Each decoding sequence's generated tokens."""

        self.prompts = PromptPool(decoder.spec, dtype, decoder.device)
        """The prompts being continued, once each, read by all their samples."""

        self.waiting: collections.deque[PendingRequest] = collections.deque()
        self.ready: collections.deque[Sequence] = collections.deque()
        self.active: list[Sequence] = []

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.ready or self.active)

    @property
    def kv_bytes(self) -> int:
        return self.pool.num_bytes + self.prompts.num_bytes

    def drop_active(self) -> None:
        """Forget the decoding sequences and free both caches (after a failure, or when the batch is idle)."""
        self.active = []
        self.pool.release()
        self.prompts.release()

    def requests(self) -> list[PendingRequest]:
        """Every request with work in this batch (waiting, ready or decoding)."""
        sequences = [*self.ready, *self.active]
        return list(self.waiting) + [s.request for s in sequences]

    def step(self) -> None:
        """Admit and prefill waiting prompts, give ready sequences cache slots, then decode one token for all."""
        prefill.admit(self)
        self.place()
        if self.active:
            self.decode()

    def place(self) -> None:
        """Give ready sequences cache slots; each distinct prompt's K/V go into the prompt pool once."""
        placing: list[Sequence] = []
        touched: dict[int, PendingRequest] = {}
        while self.ready and len(self.active) + len(placing) < self.limits.max_batch_sequences:
            sequence = self.ready.popleft()
            request = sequence.request
            request.unplaced -= 1
            touched[id(request)] = request
            if not request.done:
                placing.append(sequence)
        if placing:
            self._store_prompts(placing)
        for request in touched.values():
            if request.unplaced == 0:
                request.kv = None
        self.active.extend(placing)

    def _store_prompts(self, placing: list[Sequence]) -> None:
        """Put the prompts of ``placing`` into the prompt pool (once per distinct prompt, whatever the number of
        requests and samples continuing it) and make room for their slots."""
        try:
            kvs = {s.request.prompt_key: s.request.kv for s in placing}
            entries = self.prompts.add(kvs)  # type: ignore[arg-type]
            generated = max((s.generated_cached for s in self.active), default=0)
            # New sequences have no generated K/V yet: their slots need no copy (stale values there are masked).
            self.pool.ensure(
                len(self.active) + len(placing), generated + 1, used_slots=len(self.active), used_length=generated
            )
        except Exception as error:
            # These sequences are in no queue any more: fail their requests here, the caller fails the rest.
            for sequence in placing:
                sequence.request.fail(error, self.stats)
            raise
        for sequence in placing:
            sequence.prompt = entries[sequence.request.prompt_key]
            sequence.prompt.users += 1

    def decode(self) -> None:
        """Advance every active sequence by one token."""
        active = self.active
        decoder = lora.for_rows(self.decoder, [s.request.weights.adapter for s in active])
        positions = [s.cached for s in active]
        rope = [s.cached + s.rope_delta for s in active]  # differs after images (multimodal positions)
        attend = max(s.generated_cached for s in active) + 1
        self.use_threads(decoder, len(active))
        self.pool.ensure(len(active), attend, used_slots=len(active), used_length=attend - 1)
        try:
            device = decoder.device
            hidden = sampling_decode.decode(
                decoder,
                self.pool.cache,  # type: ignore[arg-type]
                torch.tensor([s.tokens[-1] for s in active], device=device),
                torch.tensor([s.cached for s in active], device=device),
                attend,
                self.prompts.shared([s.prompt.slot for s in active]),  # type: ignore[union-attr]
                torch.tensor(rope, device=device) if rope != positions else None,
            )
            logits = decoder_model.logits(decoder, hidden)
        except Exception as error:  # noqa: BLE001 - the step failed for all its sequences; others keep going
            for sequence in active:
                sequence.request.fail(error, self.stats)
            self.drop_active()
            return
        # Per owner: a row whose parameters break the selection fails its own request, not its neighbours.
        selected = select_tokens_per_owner(
            logits,
            [s.params for s in active],
            [s.next_uniform() for s in active],
            [s.request for s in active],
            lambda rows, chosen: decoder_model.token_logits(decoder, hidden[rows], chosen),
        )
        self.stats.decode_steps += 1
        self.stats.max_batch_sequences_seen = max(self.stats.max_batch_sequences_seen, len(active))
        leaving = [slot for slot, (sequence, result) in enumerate(zip(active, selected, strict=True))
                   if self._settle_row(sequence, result)]
        self._compact(leaving)

    def _settle_row(self, sequence: Sequence, result: Selected) -> bool:
        """Apply one row's selection; True when the sequence leaves the batch (done, ended or failed)."""
        if isinstance(result, Exception):
            sequence.request.fail(result, self.stats)
            return True
        return sequence.request.done or self.advance(sequence, *result)

    def use_threads(self, decoder: decoder_model.DecoderWeights, decode_rows: int | None) -> None:
        """One CPU thread for a small decode step, all of them for prefill (``decode_rows`` None) and larger steps.

        Only the worker's own count changes (``LocalThreads``): a training step running meanwhile keeps its threads.
        """
        if self.threads is None or decoder.device.type != "cpu":
            return
        small = decode_rows is not None and decode_rows * decoder.spec.hidden_size <= _ONE_THREAD_DECODE_ELEMENTS
        self.threads.set(1 if small else self.threads.full)

    def advance(self, sequence: Sequence, token: int, logprob: float) -> bool:
        """Append a sampled token; finish the sequence (and maybe its request) if it must stop. True when ended."""
        return advance(sequence, token, logprob, self.stats)

    def _compact(self, leaving: list[int]) -> None:
        """Drop finished slots, moving the last active sequence into each hole (descending, so moves are safe)."""
        active = self.active
        for slot in sorted(leaving, reverse=True):
            self._leave_prompt(active[slot])
            last = len(active) - 1
            if slot != last:
                self.pool.move(last, slot, active[last].generated_cached)
                active[slot] = active[last]
            active.pop()

    def _leave_prompt(self, sequence: Sequence) -> None:
        """A sequence stops decoding: free its prompt's slot when no other sequence continues that prompt."""
        entry, sequence.prompt = sequence.prompt, None
        if entry is None:
            return
        entry.users -= 1
        if entry.users == 0:
            self.prompts.remove(entry)

def advance(sequence: Sequence, token: int, logprob: float, stats: SamplerStats) -> bool:
    """Append a sampled token to ``sequence``; finish it (and its request once all its samples are) if it must
    stop. True when it ended."""
    request = sequence.request
    sequence.tokens.append(token)
    sequence.logprobs.append(logprob)
    stats.tokens_generated += 1
    try:
        reason = finish_reason(sequence, request.tokenizer)
    except Exception as error:  # noqa: BLE001 - e.g. a tokenizer that cannot decode: fail this request only
        request.fail(error, stats)
        return True
    if reason is None:
        return False
    request.results[sequence.index] = types.SampledSequence(
        stop_reason=reason, tokens=sequence.tokens, logprobs=sequence.logprobs
    )
    request.remaining -= 1
    stats.sequences_completed += 1
    if request.remaining == 0 and not request.done:
        response = types.SampleResponse(
            sequences=request.results,  # type: ignore[arg-type]
            prompt_logprobs=request.prompt_logprobs,
            topk_prompt_logprobs=request.topk_prompt_logprobs,
        )
        stats.requests_completed += 1
        settle(request.future, result=response)
    return True


def settle(
    future: concurrent.futures.Future[types.SampleResponse],
    *,
    result: types.SampleResponse | None = None,
    error: BaseException | None = None,
) -> None:
    """Resolve a future unless its caller cancelled it meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except concurrent.futures.InvalidStateError:
        pass
