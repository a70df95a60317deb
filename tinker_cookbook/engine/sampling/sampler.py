"""The local sampling engine behind ``SamplingClient``: continuous batching over a compact decoder.

Usage::

    weights = SamplingWeights.build(config, base_state, adapter_state, adapter_config, default_sampling_dtype())
    engine = SamplerEngine()
    future = engine.submit(weights, tokenizer, prompt, num_samples=4, params=types.SamplingParams(max_tokens=64))
    response = future.result()  # types.SampleResponse

How requests run (one background worker thread):

- ``submit`` validates synchronously (``BadRequestError`` naming the field) and queues the request.
- Between two decode steps the worker prefills newly arrived prompts, several packed into one forward with no
  padding (an idle worker first waits a few milliseconds while requests keep arriving, so a burst such as an RL
  batch's rollouts shares one prefill). A prompt is prefilled once; its K/V are stored once in a prompt pool and
  read by all its samples, those of every request with that prompt (an RL group sends one request per env), each
  of which keeps only its generated tokens' K/V in its own cache slot. Their first tokens are drawn together from
  the prompts' last logits, computed once per distinct prompt.
- Every decode step advances all active sequences of a decoder together: those of a merged snapshot, or those of a
  base model and of all its unmerged LoRA snapshots, each row with its own adapter (``sampling.lora``; which
  snapshots merge: ``$TINKER_COOKBOOK_SAMPLER_LORA``). Finished sequences leave the batch at once (their slot is
  refilled by the last sequence), new ones join at the next step.

Semantics (the Tinker docs are the spec):

- ``seed``: same seed and inputs give the same tokens whatever else is batched alongside. Each sample draws its
  uniforms from its own generator and tokens are picked by inverse CDF; batch composition can only change the
  fp rounding of the logits, which flips a draw only when a uniform lands within ~1e-7 of a CDF boundary.
- ``temperature=0`` is greedy; logprobs are then reported under the unscaled (temperature 1) distribution.
  ``top_k=-1`` (or 0) and ``top_p=1`` mean no cut.
  Otherwise the logprob of each sampled token is under the temperature-scaled distribution, before the top-k /
  top-p cut (the draw itself is restricted to the kept tokens).
- ``stop``: token ids, or strings searched in the decoded generated text (a string may span tokens). The token that
  completes a stop is kept in ``tokens``. Sampling also stops at the tokenizer's EOS token. ``stop_reason`` is
  ``"stop"`` then, ``"length"`` when ``max_tokens`` is reached.
- ``max_tokens=None`` means ``min(DEFAULT_MAX_TOKENS, context window - prompt length)``.
- ``include_prompt_logprobs``: one value per prompt token, the first ``None``; ``topk_prompt_logprobs=k``: per prompt
  position (the first ``None``) the k most likely ``(token_id, logprob)`` pairs, most likely first.
- Images (``ImageChunk``, or ``ImageAssetPointerChunk`` naming a local file or a ``data:`` URL) are taken by Qwen3-VL
  models (see :mod:`tinker_cookbook.engine.vision`); prompt logprobs are None at image placeholder positions. A
  text-only model refuses them with an ``UnprocessableEntityError`` (a ``BadRequestError``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import random
import secrets
import threading
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Self

import torch
import transformers

from tinker_cookbook.engine import settings, vision
from tinker_cookbook.engine.exit_hooks import CloseAtExit
from tinker_cookbook.engine.kernels import decode_kernel
from tinker_cookbook.engine.sampling import decode, decoder_model, lora
from tinker_cookbook.engine.sampling.batch import (
    KVPool,
    PromptPool,
    Sequence,
    finish_reason,
    select_tokens,
)
from tinker_cookbook.engine.sampling.requests import (
    DEFAULT_MAX_TOKENS,
    ModelLimits,
    SampleRequest,
    validate_request,
)
from tinker_cookbook.engine.threads import LocalThreads
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, RequestFailedError

__all__ = ["DEFAULT_MAX_TOKENS", "SamplerEngine", "SamplerStats", "SamplingWeights", "default_sampling_dtype"]

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
# Prompt tokens packed into one prefill forward; more waits for the next step (bounds activation memory).
_PREFILL_TOKEN_BUDGET = 4096
# Prompt positions scored per unembedding matmul when prompt logprobs are asked for (bounds [rows, vocab] memory).
_SCORE_CHUNK = 256
PromptKey = tuple[tuple[int, ...], Hashable, Hashable]
"""A prompt's tokens, the key of its images and the snapshot's unmerged adapter (by identity): requests with equal
keys have the same prompt K/V."""
# An idle engine that receives a request waits while more arrive within this gap (at most the max in all), so a
# burst of requests shares one prefill; a lone request waits one gap.
_BURST_GAP_S = 0.003
_BURST_MAX_S = 0.03
# A decode step over at most this many activation elements (rows x hidden size) runs on one CPU thread: its
# hundreds of small ops each cost more in OpenMP fork/join than a second thread saves (SmolLM2-135M, 2 idle cores:
# 1, 4 and 16 rows decode 1.4x, 1.4x and 1.03x faster on one thread). Prefill and larger steps use all threads.
_ONE_THREAD_DECODE_ELEMENTS = 16 * 576
# How long the exit hook waits for a worker to finish its current step (a prefill is bounded by the token budget).
EXIT_JOIN_TIMEOUT_S = 10.0


def default_sampling_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The sampler's default precision: ``$TINKER_COOKBOOK_SAMPLER_DTYPE`` (fp32|bf16) if set, else fp32 on CPU and
    bf16 on a GPU (``device``; None means the engine's device, see ``tinker_cookbook.engine.device``).

    fp32 keeps sampler logprobs within ~1e-5 of the fp32 learner (kl_sample_train ~0), and on CPU it is faster
    than the bf16 path was before attention and the unembedding were reworked (oneDNN's packed fp32 kernels).
    bf16 is ~1.5x faster on CPUs with bf16 matrix units, but its rounded weights and activations move logprobs by
    ~0.02 on average (~0.03 on prompt tokens; SmolLM2-135M, see bench/bench_sampling.py), which the
    importance-sampling losses must then correct. On a GPU bf16 is the default: its matmuls are several times
    faster there.
    """
    value = settings.sampler_dtype()
    if value:
        if value not in _DTYPES:
            raise BadRequestError(f"${settings.SAMPLER_DTYPE_ENV}={value!r} is not a sampler dtype; use one of fp32, bf16")
        return _DTYPES[value]
    if device is None:
        from tinker_cookbook.engine.device import engine_device

        device = engine_device()
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


@dataclass(frozen=True, eq=False)
class SamplingWeights:
    """Immutable weights of one model snapshot for sampling: base + optional LoRA, merged once, or kept apart.

    Compared and hashed by identity. Snapshots with their own (merged) decoder each decode in a batch of their own;
    unmerged snapshots of one base and that base itself share its decoder and decode together (``sampling.lora``).
    """

    decoder: decoder_model.DecoderWeights
    """The fused weights the snapshot decodes with: its merged copy, or the base shared with other snapshots."""

    limits: ModelLimits
    adapter: lora.Adapter | None = None
    """The unmerged LoRA applied on top of ``decoder`` (None: nothing to add)."""

    @classmethod
    def build(
        cls,
        config: transformers.PretrainedConfig,
        base_state: Mapping[str, torch.Tensor],
        adapter_state: Mapping[str, torch.Tensor] | None,
        adapter_config: Mapping[str, Any] | None,
        dtype: torch.dtype,
        lora_mode: str | None = None,
    ) -> SamplingWeights:
        """Fuse an HF state dict into sampler weights of ``dtype``, with a PEFT LoRA adapter if given.

        ``base_state`` holds plain HF keys and is only read (merged tensors are new copies). ``adapter_state`` holds
        PEFT saved-format keys; the update is ``lora_alpha / r * B @ A`` (``/ sqrt(r)`` with rsLoRA), merged into
        a copy of the weights or kept apart on the shared base: ``lora_mode`` merged | unmerged | auto (None:
        ``$TINKER_COOKBOOK_SAMPLER_LORA``, else auto), see ``sampling.lora``.
        """
        decoder: decoder_model.DecoderWeights | None = None
        adapter = None
        if lora.use_unmerged(lora.lora_mode(lora_mode), base_state, dtype):
            base = lora.shared_base(config, base_state, dtype)
            if not adapter_state:
                decoder = base
            else:
                adapter = lora.build_adapter(base, base_state, adapter_state, adapter_config)
                decoder = base if adapter is not None else None
        if decoder is None:
            decoder = decoder_model.build_decoder_weights(config, base_state, adapter_state, adapter_config, dtype)
        spec = decoder.spec
        limits = ModelLimits(
            vocab_size=spec.vocab_size,
            context_window=spec.max_positions,
            model_type=spec.model_type,
            accepts_images=spec.model_type.startswith("qwen3_vl") and spec.model_type != "qwen3_vl_text",
            vision=vision.sampler_vision(config, base_state),
        )
        return cls(decoder=decoder, limits=limits, adapter=adapter)

    @property
    def model(self) -> decoder_model.DecoderWeights:
        """The decoder with this snapshot's adapter on every row."""
        return self.decoder if self.adapter is None else self.adapter.alone()

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    @property
    def vocab_size(self) -> int:
        return self.limits.vocab_size

    @property
    def context_window(self) -> int:
        return self.limits.context_window


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


class _Request:
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


class _Batch:
    """Requests and sequences of one decoder: a merged snapshot, or a base and its unmerged snapshots."""

    def __init__(self, decoder: decoder_model.DecoderWeights):
        self.decoder = decoder
        dtype = decoder_model.kv_cache_dtype(decoder)
        self.pool = KVPool(decoder.spec, dtype, decoder.device)
        """Each decoding sequence's generated tokens."""

        self.prompts = PromptPool(decoder.spec, dtype, decoder.device)
        """The prompts being continued, once each, read by all their samples."""

        self.waiting: collections.deque[_Request] = collections.deque()
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


class SamplerEngine:
    """Serves sample requests for any number of weight snapshots from one background worker thread."""

    def __init__(self, *, max_batch_sequences: int = 256, prefill_token_budget: int = _PREFILL_TOKEN_BUDGET):
        if max_batch_sequences < 1:
            raise BadRequestError(f"max_batch_sequences must be >= 1, got {max_batch_sequences}")
        self.max_batch_sequences = max_batch_sequences
        self.prefill_token_budget = prefill_token_budget
        self._cond = threading.Condition()
        self._incoming: list[_Request] = []
        self._closed = False
        self._stats = SamplerStats()
        self._batches: dict[int, _Batch] = {}
        self._threads: LocalThreads | None = None
        """The worker's own torch thread count (set on the worker thread; other threads keep theirs)."""

        # A daemon thread, so an idle engine never keeps the process alive; the exit hook stops it in time.
        self._thread = threading.Thread(target=self._run, name="tinker-sampler", daemon=True)
        _running_engines.add(self)
        self._thread.start()

    # ---------------------------------------------------------------------------------------------------------
    # Public API
    # ---------------------------------------------------------------------------------------------------------

    def submit(
        self,
        weights: SamplingWeights,
        tokenizer: Any,
        prompt: types.ModelInput,
        num_samples: int,
        params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> concurrent.futures.Future[types.SampleResponse]:
        """Queue a request; bad input raises ``BadRequestError`` here, before anything is queued."""
        if not isinstance(weights, SamplingWeights):
            raise BadRequestError(f"weights must be SamplingWeights, got {type(weights).__name__}")
        spec = validate_request(
            weights.limits,
            tokenizer,
            prompt,
            num_samples,
            params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
        )
        request = _Request(weights, tokenizer, spec)
        with self._cond:
            if self._closed:
                raise RequestFailedError("the sampler engine is closed; create a new one")
            self._incoming.append(request)
            self._cond.notify()
        return request.future

    def stats(self) -> SamplerStats:
        return replace(self._stats)

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker after its current step; requests still pending fail with ``RequestFailedError``.

        Waits at most ``timeout`` seconds (None: as long as it takes) for the worker to finish. Idempotent.
        """
        with self._cond:
            self._closed = True
            self._cond.notify()
        _running_engines.discard(self)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------------------
    # Worker
    # ---------------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        self._threads = LocalThreads()
        # Small decode steps run their torch ops on one thread (``_use_threads``); their matmuls may use them all.
        decode_kernel.set_matmul_threads(self._threads.full)
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not self._incoming and not self._batches:
                        self._cond.wait()
                    if not self._batches:
                        self._gather_burst()
                    if self._closed:
                        break
                    incoming, self._incoming = self._incoming, []
                for request in incoming:
                    key = id(request.weights.decoder)  # the batch holds the decoder: the id stays its own
                    if key not in self._batches:
                        self._batches[key] = _Batch(request.weights.decoder)
                    self._batches[key].waiting.append(request)
                for key, batch in list(self._batches.items()):
                    try:
                        self._step(batch)
                    except Exception as error:  # noqa: BLE001 - e.g. out of memory growing the cache
                        # Unexpected here (forward errors are handled per request): fail this snapshot's
                        # requests rather than let the worker die with every future left pending.
                        for request in self._requests_of(batch):
                            self._fail(request, error)
                        batch.waiting.clear()
                        batch.ready.clear()
                        batch.drop_active()
                    if batch.idle:
                        batch.drop_active()
                        del self._batches[key]
                held = sum(b.kv_bytes for b in self._batches.values())
                self._stats.peak_kv_bytes = max(self._stats.peak_kv_bytes, held)
                # A waiting worker keeps no reference to the last requests: their snapshots (a merged copy, or an
                # unmerged adapter and the base) are freed as soon as their callers drop them.
                incoming, request, batch = [], None, None  # type: ignore[assignment]
        self._fail_everything(RequestFailedError(
            "the sampler was shut down (SamplerEngine.close(), LocalBackend.close() or process exit) before this "
            "request finished; wait for sampling results before closing or exiting"
        ))

    def _gather_burst(self) -> None:
        """With the lock held, when an idle engine gets requests: wait while more keep coming (each within
        ``_BURST_GAP_S`` of the last, ``_BURST_MAX_S`` at most), so that a burst, such as an RL batch submitting
        all its rollouts at once, is prefilled in one forward rather than its first prompt alone, then the rest."""
        deadline = time.monotonic() + _BURST_MAX_S
        count = len(self._incoming)
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(min(_BURST_GAP_S, left))
            if len(self._incoming) == count:
                break
            count = len(self._incoming)

    @staticmethod
    def _requests_of(batch: _Batch) -> list[_Request]:
        sequences = [*batch.ready, *batch.active]
        return list(batch.waiting) + [s.request for s in sequences]

    def _step(self, batch: _Batch) -> None:
        self._admit(batch)
        self._place(batch)
        if batch.active:
            self._decode(batch)

    def _admit(self, batch: _Batch) -> None:
        """Prefill waiting prompts while their samples fit in the batch (packed, within the token budget)."""
        room = self.max_batch_sequences - len(batch.active) - len(batch.ready)
        chosen: list[_Request] = []
        tokens = 0
        while batch.waiting and room > 0:
            request = batch.waiting[0]
            if chosen and tokens + len(request.spec.prompt) > self.prefill_token_budget:
                break
            batch.waiting.popleft()
            if request.done:  # cancelled by its caller
                continue
            chosen.append(request)
            tokens += len(request.spec.prompt)
            room -= request.spec.num_samples
        # One prefill per adapter: a prompt's K/V are its own snapshot's (a shared prefix too).
        by_adapter: dict[int, list[_Request]] = {}
        for request in chosen:
            by_adapter.setdefault(id(request.weights.adapter), []).append(request)
        for group in by_adapter.values():
            self._prefill(batch, group)

    def _prefill(self, batch: _Batch, requests: list[_Request]) -> None:
        """One packed forward over the distinct prompts of ``requests`` (identical prompts are computed once), all
        of one snapshot or of snapshots with the same decoder and adapter."""
        decoder = requests[0].weights.model
        self._use_threads(decoder, None)
        prompts = {r.prompt_key: (r.spec.prompt, r.spec.vision) for r in requests}
        distinct = list(prompts)
        try:
            limits = requests[0].weights.limits
            images = limits.vision.pack([prompts[k] for k in distinct]) if limits.vision is not None else None
            result = decoder_model.prefill(decoder, [prompts[k][0] for k in distinct], batch.pool.dtype, images)
            # The last position's hidden state of each distinct prompt: every sample of every request with that
            # prompt draws its first token from these logits, computed once in one matmul.
            last_hidden = torch.cat([hidden[-1:] for hidden in result.hidden])
            last_logits = decoder_model.logits(decoder, last_hidden)
        except Exception as error:  # noqa: BLE001 - isolate the request that breaks the forward
            if len(requests) == 1:
                self._fail(requests[0], error)
            else:
                for request in requests:
                    self._prefill(batch, [request])
            return
        stats = self._stats
        stats.prefill_forwards += 1
        stats.prompts_prefilled += len(distinct)
        stats.prefill_tokens += sum(len(prompts[k][0]) for k in distinct)
        stats.max_prompts_per_prefill = max(stats.max_prompts_per_prefill, len(distinct))
        row_of = {key: row for row, key in enumerate(distinct)}
        started: list[tuple[_Request, int]] = []
        for request in requests:
            row = row_of[request.prompt_key]
            try:
                self._score_prompt(batch, request, result.hidden[row])
            except Exception as error:  # noqa: BLE001 - one request's failure must not stop the others
                self._fail(request, error)
                continue
            # Requests sharing a prompt share its K/V tensor: it is only ever read (copied into the prompt pool).
            request.kv = result.kv[row]
            started.append((request, row))
        self._first_tokens(batch, decoder, started, last_logits, last_hidden)

    def _score_prompt(self, batch: _Batch, request: _Request, hidden: torch.Tensor) -> None:
        """The prompt logprobs (and top-k) of ``request``, when asked for."""
        spec = request.spec
        if not (spec.include_prompt_logprobs or spec.topk_prompt_logprobs):
            return
        scored, topk = _score_prompt(request.weights.model, hidden, spec.prompt, spec.topk_prompt_logprobs)
        if spec.vision is not None:  # an image placeholder has no meaningful logprob
            placeholder = request.weights.limits.vision.image_token_id  # type: ignore[union-attr]
            for position in (i for i, t in enumerate(spec.prompt) if t == placeholder):
                scored[position] = None
                if topk is not None:
                    topk[position] = None
        request.prompt_logprobs = scored if spec.include_prompt_logprobs else None
        request.topk_prompt_logprobs = topk

    def _first_tokens(self, batch: _Batch, decoder: decoder_model.DecoderWeights, started: list[tuple[_Request, int]],
                      last_logits: torch.Tensor, last_hidden: torch.Tensor) -> None:
        """Draw every sample's first token from its prompt's last logits (row ``row`` of ``last_logits``), all
        requests of a prefill together, and queue the unfinished samples for cache slots."""
        sequences: list[tuple[Sequence, int]] = []
        for request, row in started:
            spec = request.spec
            sequences += [
                (
                    Sequence(
                        request=request,
                        index=index,
                        params=spec.row,
                        rng=rng,
                        max_tokens=spec.max_tokens,
                        stop_token_ids=spec.stop_token_ids,
                        stop_strings=spec.stop_strings,
                        prompt_len=len(spec.prompt),
                        rope_delta=spec.vision.rope_delta if spec.vision is not None else 0,
                    ),
                    row,
                )
                for index, rng in enumerate(request.sample_rngs())
            ]
        # In batch-sized chunks, to bound the [rows, vocab] memory.
        for start in range(0, len(sequences), self.max_batch_sequences):
            chunk = sequences[start : start + self.max_batch_sequences]
            rows = torch.tensor([row for _, row in chunk], device=last_logits.device)
            try:
                tokens, logprobs = select_tokens(
                    last_logits[rows],
                    [s.params for s, _ in chunk],
                    [s.next_uniform() for s, _ in chunk],
                    lambda chosen: decoder_model.token_logits(decoder, last_hidden[rows], chosen),  # noqa: B023
                )
            except Exception as error:  # noqa: BLE001 - fail the requests of this chunk, not the others
                for sequence, _ in chunk:
                    self._fail(sequence.request, error)
                continue
            for (sequence, _), token, logprob in zip(chunk, tokens, logprobs, strict=True):
                if not sequence.request.done and not self._advance(sequence, token, logprob):
                    batch.ready.append(sequence)
                    sequence.request.unplaced += 1
        for request, _ in started:
            if not request.unplaced:
                request.kv = None

    def _place(self, batch: _Batch) -> None:
        """Give ready sequences cache slots; each distinct prompt's K/V go into the prompt pool once."""
        placing: list[Sequence] = []
        touched: dict[int, _Request] = {}
        while batch.ready and len(batch.active) + len(placing) < self.max_batch_sequences:
            sequence = batch.ready.popleft()
            request = sequence.request
            request.unplaced -= 1
            touched[id(request)] = request
            if not request.done:
                placing.append(sequence)
        if placing:
            self._store_prompts(batch, placing)
        for request in touched.values():
            if request.unplaced == 0:
                request.kv = None
        batch.active.extend(placing)

    def _store_prompts(self, batch: _Batch, placing: list[Sequence]) -> None:
        """Put the prompts of ``placing`` into the prompt pool (once per distinct prompt, whatever the number of
        requests and samples continuing it) and make room for their slots."""
        try:
            kvs = {s.request.prompt_key: s.request.kv for s in placing}
            entries = batch.prompts.add(kvs)  # type: ignore[arg-type]
            generated = max((s.generated_cached for s in batch.active), default=0)
            # New sequences have no generated K/V yet: their slots need no copy (stale values there are masked).
            batch.pool.ensure(
                len(batch.active) + len(placing), generated + 1, used_slots=len(batch.active), used_length=generated
            )
        except Exception as error:
            # These sequences are in no queue any more: fail their requests here, the caller fails the rest.
            for sequence in placing:
                self._fail(sequence.request, error)
            raise
        for sequence in placing:
            sequence.prompt = entries[sequence.request.prompt_key]
            sequence.prompt.users += 1

    def _decode(self, batch: _Batch) -> None:
        """Advance every active sequence of ``batch`` by one token."""
        active = batch.active
        decoder = lora.for_rows(batch.decoder, [s.request.weights.adapter for s in active])
        positions = [s.cached for s in active]
        rope = [s.cached + s.rope_delta for s in active]  # differs after images (multimodal positions)
        attend = max(s.generated_cached for s in active) + 1
        self._use_threads(decoder, len(active))
        batch.pool.ensure(len(active), attend, used_slots=len(active), used_length=attend - 1)
        try:
            device = decoder.device
            hidden = decode.decode(
                decoder,
                batch.pool.cache,  # type: ignore[arg-type]
                torch.tensor([s.tokens[-1] for s in active], device=device),
                torch.tensor([s.cached for s in active], device=device),
                attend,
                batch.prompts.shared([s.prompt.slot for s in active]),  # type: ignore[union-attr]
                torch.tensor(rope, device=device) if rope != positions else None,
            )
            logits = decoder_model.logits(decoder, hidden)
            tokens, logprobs = select_tokens(
                logits,
                [s.params for s in active],
                [s.next_uniform() for s in active],
                lambda chosen: decoder_model.token_logits(decoder, hidden, chosen),
            )
        except Exception as error:  # noqa: BLE001 - the step failed for all its sequences; others keep going
            for sequence in active:
                self._fail(sequence.request, error)
            batch.drop_active()
            return
        self._stats.decode_steps += 1
        self._stats.max_batch_sequences_seen = max(self._stats.max_batch_sequences_seen, len(active))
        leaving = [
            slot
            for slot, (sequence, token, logprob) in enumerate(zip(active, tokens, logprobs, strict=True))
            if sequence.request.done or self._advance(sequence, token, logprob)
        ]
        self._compact(batch, leaving)

    def _use_threads(self, decoder: decoder_model.DecoderWeights, decode_rows: int | None) -> None:
        """One CPU thread for a small decode step, all of them for prefill (``decode_rows`` None) and larger steps.

        Only the worker's own count changes (``LocalThreads``): a training step running meanwhile keeps its threads.
        """
        if self._threads is None or decoder.device.type != "cpu":
            return
        small = decode_rows is not None and decode_rows * decoder.spec.hidden_size <= _ONE_THREAD_DECODE_ELEMENTS
        self._threads.set(1 if small else self._threads.full)

    def _advance(self, sequence: Sequence, token: int, logprob: float) -> bool:
        """Append a sampled token; finish the sequence (and maybe its request) if it must stop. True when ended."""
        request = sequence.request
        sequence.tokens.append(token)
        sequence.logprobs.append(logprob)
        self._stats.tokens_generated += 1
        try:
            reason = finish_reason(sequence, request.tokenizer)
        except Exception as error:  # noqa: BLE001 - e.g. a tokenizer that cannot decode: fail this request only
            self._fail(request, error)
            return True
        if reason is None:
            return False
        request.results[sequence.index] = types.SampledSequence(
            stop_reason=reason, tokens=sequence.tokens, logprobs=sequence.logprobs
        )
        request.remaining -= 1
        self._stats.sequences_completed += 1
        if request.remaining == 0 and not request.done:
            response = types.SampleResponse(
                sequences=request.results,  # type: ignore[arg-type]
                prompt_logprobs=request.prompt_logprobs,
                topk_prompt_logprobs=request.topk_prompt_logprobs,
            )
            self._stats.requests_completed += 1
            _settle(request.future, result=response)
        return True

    def _compact(self, batch: _Batch, leaving: list[int]) -> None:
        """Drop finished slots, moving the last active sequence into each hole (descending, so moves are safe)."""
        active = batch.active
        for slot in sorted(leaving, reverse=True):
            self._leave_prompt(batch, active[slot])
            last = len(active) - 1
            if slot != last:
                batch.pool.move(last, slot, active[last].generated_cached)
                active[slot] = active[last]
            active.pop()

    @staticmethod
    def _leave_prompt(batch: _Batch, sequence: Sequence) -> None:
        """A sequence stops decoding: free its prompt's slot when no other sequence continues that prompt."""
        entry, sequence.prompt = sequence.prompt, None
        if entry is None:
            return
        entry.users -= 1
        if entry.users == 0:
            batch.prompts.remove(entry)

    def _fail(self, request: _Request, error: BaseException) -> None:
        if request.done:
            return
        self._stats.requests_failed += 1
        if not isinstance(error, RequestFailedError):
            wrapped = RequestFailedError(f"sampling failed: {type(error).__name__}: {error}")
            wrapped.__cause__ = error
            error = wrapped
        _settle(request.future, error=error)

    def _fail_everything(self, error: RequestFailedError) -> None:
        with self._cond:
            pending = list(self._incoming)
            self._incoming = []
        for batch in self._batches.values():
            pending += self._requests_of(batch)
            batch.drop_active()
        self._batches.clear()
        for request in pending:
            self._fail(request, error)


def _stop_at_exit(engine: SamplerEngine) -> None:
    """Stop every sampler worker while the interpreter is still whole.

    atexit hooks run after non-daemon threads have been joined and before finalization. A daemon worker left
    running inside a torch op is killed by CPython (pthread_exit) when it next takes the GIL during finalization;
    the forced unwinding through torch's C++ frames then aborts the process with "terminate called without an
    active exception". Requests still pending fail with ``RequestFailedError``.
    """
    engine.close(timeout=EXIT_JOIN_TIMEOUT_S)


_running_engines: CloseAtExit[SamplerEngine] = CloseAtExit(_stop_at_exit)


def _settle(
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


def _score_prompt(
    decoder: decoder_model.DecoderWeights, hidden: torch.Tensor, prompt: list[int], topk: int
) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
    """Logprob of each prompt token given the ones before (first None), and optionally the top-k at each position."""
    scored: list[float | None] = [None]
    ranked: list[list[tuple[int, float]] | None] | None = [None] if topk else None
    targets = torch.tensor(prompt[1:], device=hidden.device)
    for start in range(0, len(prompt) - 1, _SCORE_CHUNK):
        end = min(start + _SCORE_CHUNK, len(prompt) - 1)
        chunk_targets = targets[start:end, None]
        logprobs = torch.log_softmax(
            decoder_model.logits(decoder, hidden[start:end], also=chunk_targets), dim=-1
        )
        scored += logprobs.gather(1, chunk_targets)[:, 0].tolist()
        if ranked is not None:
            values, indices = logprobs.topk(topk, dim=-1)
            ranked += [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    return scored, ranked
