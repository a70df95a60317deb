"""The local sampling engine behind ``SamplingClient``: continuous batching over a compact decoder (or, for models
without one, over the transformers model itself: ``sampling.general``).

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
  refilled by the last sequence), new ones join at the next step. That work of each step is ``steps``'; a
  snapshot's weights are ``weights``'.

Semantics (the Tinker docs are the spec):

- ``seed``: same seed and inputs give the same tokens whatever else is batched alongside. Each sample draws its
  uniforms from its own generator and tokens are picked by inverse CDF; batch composition can only change the
  fp rounding of the logits, which flips a draw only when a uniform lands within ~1e-7 of a CDF boundary.
- ``temperature=0`` is greedy; logprobs are then reported under the unscaled (temperature 1) distribution.
  ``top_k=-1`` (or 0, or at least the vocabulary size) and ``top_p=1`` mean no cut.
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

import concurrent.futures
import threading
import time
from dataclasses import replace
from typing import Any, Self

import torch

from tinker_cookbook.engine.exit_hooks import CloseAtExit
from tinker_cookbook.engine.kernels import decode_kernel
from tinker_cookbook.engine.sampling.general import GeneralBatch, GeneralModel
from tinker_cookbook.engine.sampling.requests import validate_request
from tinker_cookbook.engine.sampling.steps import BatchLimits, DecoderBatch, PendingRequest, SamplerStats
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.engine.threads import LocalThreads
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, RequestFailedError

# Prompt tokens packed into one prefill forward; more waits for the next step (bounds activation memory).
_PREFILL_TOKEN_BUDGET = 4096
# An idle engine that receives a request waits while more arrive within this gap (at most the max in all), so a
# burst of requests shares one prefill; a lone request waits one gap.
_BURST_GAP_S = 0.003
_BURST_MAX_S = 0.03
# How long the exit hook waits for a worker to finish its current step (a prefill is bounded by the token budget).
EXIT_JOIN_TIMEOUT_S = 10.0


class SamplerEngine:
    """Serves sample requests for any number of weight snapshots from one background worker thread."""

    def __init__(self, *, max_batch_sequences: int = 256, prefill_token_budget: int = _PREFILL_TOKEN_BUDGET):
        if max_batch_sequences < 1:
            raise BadRequestError(f"max_batch_sequences must be >= 1, got {max_batch_sequences}")
        self._limits = BatchLimits(max_batch_sequences, prefill_token_budget)
        self._cond = threading.Condition()
        self._incoming: list[PendingRequest] = []
        self._closed = False
        self._stats = SamplerStats()
        self._batches: dict[int, DecoderBatch | GeneralBatch] = {}
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
        request = PendingRequest(weights, tokenizer, spec)
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
                        self._batches[key] = self._new_batch(request.weights.decoder)
                    self._batches[key].waiting.append(request)
                for key, batch in list(self._batches.items()):
                    try:
                        self._step(batch)
                    except Exception as error:  # noqa: BLE001 - e.g. out of memory growing the cache
                        # Unexpected here (forward errors are handled per request): fail this snapshot's
                        # requests rather than let the worker die with every future left pending.
                        for request in batch.requests():
                            request.fail(error, self._stats)
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

    def _new_batch(self, decoder: Any) -> DecoderBatch | GeneralBatch:
        if isinstance(decoder, GeneralModel):  # the general path (engine.model_paths)
            return GeneralBatch(decoder, self._limits, self._stats)
        return DecoderBatch(decoder, self._limits, self._stats, self._threads)

    def _step(self, batch: DecoderBatch | GeneralBatch) -> None:
        batch.step()

    def _fail_everything(self, error: RequestFailedError) -> None:
        with self._cond:
            pending = list(self._incoming)
            self._incoming = []
        for batch in self._batches.values():
            pending += batch.requests()
            batch.drop_active()
        self._batches.clear()
        for request in pending:
            request.fail(error, self._stats)



def _stop_at_exit(engine: SamplerEngine) -> None:
    """Stop every sampler worker while the interpreter is still whole.

    atexit hooks run after non-daemon threads have been joined and before finalization. A daemon worker left
    running inside a torch op is killed by CPython (pthread_exit) when it next takes the GIL during finalization;
    the forced unwinding through torch's C++ frames then aborts the process with "terminate called without an
    active exception". Requests still pending fail with ``RequestFailedError``.
    """
    engine.close(timeout=EXIT_JOIN_TIMEOUT_S)


_running_engines: CloseAtExit[SamplerEngine] = CloseAtExit(_stop_at_exit)
