"""Validation of sampling requests: every bad field becomes a BadRequestError that names it, its value and the fix.

Runs synchronously in ``SamplerEngine.submit`` so that a bad request fails at the call site and never reaches the
worker thread that serves everyone else.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from tinker_cookbook.engine.sampling.batch import RowParams
from tinker_cookbook.engine.vision import PromptImages, PromptVision, expand_model_input
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

DEFAULT_MAX_TOKENS = 1024
"""``max_tokens=None`` samples up to this many tokens, or up to the end of the context window if that is nearer."""

MAX_NUM_SAMPLES = 1024
"""The most samples one request may ask for. A request's samples queue for slots of the shared batch ahead of
every later request, so an unbounded count would hold the sampler for everyone else; 1024 is far above RL group
sizes. Callers who need more split them into several requests."""


MIN_TEMPERATURE = 1e-6
"""The smallest temperature above 0: much smaller ones overflow the scaled logits (float32 ends near 3e38) into
NaN, and already 1e-6 draws the most likely token with probability 1 in float32 (greedy is ``temperature=0``)."""


@dataclass(frozen=True)
class ModelLimits:
    """What a request is checked against."""

    vocab_size: int
    context_window: int
    model_type: str
    accepts_images: bool
    vision: PromptImages | None = None
    """Image handling of a vision-language model (the fast path's ``SamplerVision`` with its vision tower); None
    for text-only ones."""


@dataclass(frozen=True)
class SampleRequest:
    """A validated request with its defaults resolved."""

    prompt: list[int]
    num_samples: int
    max_tokens: int
    row: RowParams
    seed: int | None
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    include_prompt_logprobs: bool
    topk_prompt_logprobs: int
    vision: PromptVision | None = None
    """The prompt's images and multimodal positions; None for a text-only prompt."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def prompt_tokens(prompt: types.ModelInput, limits: ModelLimits) -> tuple[list[int], PromptVision | None]:
    """The prompt's token ids (images as their placeholder tokens), checked against the vocabulary, and its images
    with their positions (None without images); image chunks for a text-only model are refused."""
    if not isinstance(prompt, types.ModelInput):
        raise BadRequestError(f"prompt must be a types.ModelInput, got {type(prompt).__name__}")
    if limits.vision is not None:
        tokens, vision = limits.vision.prompt(prompt, "prompt")
    else:
        tokens, vision = expand_model_input(prompt, "prompt", None, f"model type {limits.model_type!r}")[0], None
    if not tokens:
        raise BadRequestError(
            "prompt is empty; give at least one token (e.g. the BOS token or a chat header)"
        )
    low, high = min(tokens), max(tokens)
    if low < 0 or high >= limits.vocab_size:
        bad = low if low < 0 else high
        raise BadRequestError(
            f"prompt holds token id {bad}, outside the model's vocabulary [0, {limits.vocab_size}); "
            "encode the prompt with this model's tokenizer"
        )
    return tokens, vision


def _max_tokens(value: Any, prompt_len: int, limits: ModelLimits) -> int:
    room = limits.context_window - prompt_len
    if room < 1:
        raise BadRequestError(
            f"the prompt has {prompt_len} tokens and fills the context window of {limits.context_window}; "
            "shorten the prompt"
        )
    if value is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if not _is_int(value) or value < 1:
        raise BadRequestError(f"sampling_params.max_tokens must be an integer >= 1, got {value!r}")
    if value > room:
        raise BadRequestError(
            f"sampling_params.max_tokens={value} with a {prompt_len}-token prompt exceeds the context window of "
            f"{limits.context_window}; use max_tokens <= {room} or a shorter prompt"
        )
    return int(value)


def _row_params(params: types.SamplingParams, vocab_size: int) -> RowParams:
    temperature, top_k, top_p = params.temperature, params.top_k, params.top_p
    if not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) or temperature < 0:
        raise BadRequestError(
            f"sampling_params.temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
        )
    if 0 < temperature < MIN_TEMPERATURE:
        raise BadRequestError(
            f"sampling_params.temperature={temperature!r} is too small to sample with: logits divided by it "
            f"overflow; use 0 for greedy decoding or a temperature of at least {MIN_TEMPERATURE}"
        )
    if not _is_int(top_k) or top_k < -1:
        raise BadRequestError(
            f"sampling_params.top_k must be an integer >= 1, or -1 for no limit, got {top_k!r}"
        )
    if not isinstance(top_p, numbers.Real) or not (0.0 < top_p <= 1.0):
        raise BadRequestError(f"sampling_params.top_p must be in (0, 1] (1 = no nucleus cut), got {top_p!r}")
    # A top_k of the vocabulary or more cuts nothing: it becomes 0 (no limit), so that no huge value reaches torch.
    return RowParams(temperature=float(temperature), top_k=0 if top_k >= vocab_size else max(int(top_k), 0),
                     top_p=float(top_p))


def _stops(stop: Any, limits: ModelLimits) -> tuple[frozenset[int], tuple[str, ...]]:
    if stop is None:
        return frozenset(), ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise BadRequestError(
            f"sampling_params.stop must be a string, a list of strings or a list of token ids, got {stop!r}"
        )
    if all(isinstance(s, str) for s in stop):
        if any(s == "" for s in stop):
            raise BadRequestError(f"sampling_params.stop holds an empty string: {list(stop)!r}; remove it")
        return frozenset(), tuple(stop)
    if all(_is_int(s) for s in stop):
        bad = [s for s in stop if not 0 <= s < limits.vocab_size]
        if bad:
            raise BadRequestError(
                f"sampling_params.stop holds token id(s) {bad} outside the vocabulary [0, {limits.vocab_size})"
            )
        return frozenset(int(s) for s in stop), ()
    raise BadRequestError(
        f"sampling_params.stop must be all strings or all token ids, not a mix: {list(stop)!r}"
    )


def _eos_id(tokenizer: Any, vocab_size: int) -> int | None:
    eos: Any = getattr(tokenizer, "eos_token_id", None)
    return int(eos) if _is_int(eos) and 0 <= eos < vocab_size else None


def validate_request(
    limits: ModelLimits,
    tokenizer: Any,
    prompt: types.ModelInput,
    num_samples: int,
    params: types.SamplingParams,
    include_prompt_logprobs: bool,
    topk_prompt_logprobs: int,
) -> SampleRequest:
    """Check every field of a sample request; resolve defaults (see ``DEFAULT_MAX_TOKENS``)."""
    if not isinstance(params, types.SamplingParams):
        raise BadRequestError(f"sampling_params must be a types.SamplingParams, got {type(params).__name__}")
    if not _is_int(num_samples) or num_samples < 1:
        raise BadRequestError(f"num_samples must be an integer >= 1, got {num_samples!r}")
    if num_samples > MAX_NUM_SAMPLES:
        raise BadRequestError(
            f"num_samples={num_samples} is more than the limit of {MAX_NUM_SAMPLES} per request; split it into "
            f"several sample calls of at most {MAX_NUM_SAMPLES} each"
        )
    if not _is_int(topk_prompt_logprobs) or not 0 <= topk_prompt_logprobs <= limits.vocab_size:
        raise BadRequestError(
            f"topk_prompt_logprobs must be an integer in [0, {limits.vocab_size}] (0 = off), "
            f"got {topk_prompt_logprobs!r}"
        )
    if params.seed is not None and not _is_int(params.seed):
        raise BadRequestError(f"sampling_params.seed must be an integer or None, got {params.seed!r}")
    tokens, vision = prompt_tokens(prompt, limits)
    stop_ids, stop_strings = _stops(params.stop, limits)
    if stop_strings and tokenizer is None:
        raise BadRequestError(
            "sampling_params.stop has strings but no tokenizer was given to decode the samples"
        )
    eos = _eos_id(tokenizer, limits.vocab_size)
    if eos is not None:
        stop_ids = stop_ids | {eos}
    return SampleRequest(
        prompt=tokens,
        num_samples=int(num_samples),
        max_tokens=_max_tokens(params.max_tokens, len(tokens), limits),
        row=_row_params(params, limits.vocab_size),
        seed=None if params.seed is None else int(params.seed),
        stop_token_ids=stop_ids,
        stop_strings=stop_strings,
        include_prompt_logprobs=bool(include_prompt_logprobs),
        topk_prompt_logprobs=int(topk_prompt_logprobs),
        vision=vision,
    )
