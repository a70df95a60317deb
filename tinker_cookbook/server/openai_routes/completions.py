"""``/v1/completions``: text (or token ids) in, sampled continuations out."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tinker_cookbook.renderers.stops import cut_at_stop_strings
from tinker_cookbook.server.app import ServerLimits
from tinker_cookbook.server.openai_bodies import (
    CompletionRequest,
    check_common,
    parse,
    sampling_params,
    unsupported,
    warning_headers,
)
from tinker_cookbook.server.openai_models import ModelRegistry
from tinker_cookbook.server.openai_routes.common import (
    SSE_HEADERS,
    Choice,
    sample,
    sse,
    stream_pieces,
    token_pieces,
    token_usage,
    tokens_within,
)
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.backend import Backend
from tinker_cookbook.tinker.errors import BadRequestError

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default for ``/v1/completions``; chat defaults to the sampler's (up to the context end)."""


def _prompt_count(prompt: str | list[str] | list[int] | list[list[int]]) -> int:
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        return 1
    return len(prompt)


def _completion_prompts(prompt: str | list[str] | list[int] | list[list[int]], tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise BadRequestError("prompt is an empty list; give a string, a list of strings or token ids")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    out = []
    for p in prompt:
        out.append(list(tokenizer.encode(p)) if isinstance(p, str) else list(p))  # type: ignore[arg-type]
    return out


def _check_completion(req: CompletionRequest) -> None:
    if req.echo:
        raise unsupported("echo", True, "this server returns only the completion; send echo=false")
    if req.suffix:
        raise unsupported("suffix", req.suffix, "the local sampler does not insert text; remove it")
    if req.best_of is not None and req.best_of != req.n:
        raise unsupported("best_of", req.best_of, f"only best_of == n (n={req.n}) or unset is supported")
    if req.logprobs:
        raise unsupported("logprobs", req.logprobs, "the local sampler reports the sampled tokens' logprobs but "
                          "not the top alternatives; use logprobs=0")


def _completion_choice(index: int, seq: types.SampledSequence, stops: list[str], tokenizer: Any) -> Choice:
    tokens = list(seq.tokens)
    eos = getattr(tokenizer, "eos_token_id", None)
    if seq.stop_reason == "stop" and tokens and tokens[-1] == eos:
        tokens = tokens[:-1]  # the end-of-sequence token is not part of the text
    text, cut = cut_at_stop_strings(str(tokenizer.decode(tokens, skip_special_tokens=False)), stops)
    finish = "stop" if cut or seq.stop_reason == "stop" else "length"
    return Choice(index=index, text=text, finish_reason=finish, tokens=tokens, logprobs=list(seq.logprobs or []))


def _completion_logprobs(choice: Choice, tokenizer: Any) -> dict[str, Any]:
    pieces = token_pieces(tokenizer, choice.tokens)
    kept = tokens_within(pieces, len(choice.text))
    offsets, offset = [], 0
    for piece in pieces[:kept]:
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": pieces[:kept], "token_logprobs": choice.logprobs[:kept], "top_logprobs": None,
            "text_offset": offsets}


async def completions(request: Request, backend: Backend[Any], registry: ModelRegistry,
                      limits: ServerLimits) -> Any:
    req: CompletionRequest = parse(CompletionRequest, await request.body())
    _check_completion(req)
    stops = check_common(req, _prompt_count(req.prompt), limits)
    headers = warning_headers(req)
    served = await registry.get(req.model)
    prompts = _completion_prompts(req.prompt, served.tokenizer)
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    params = sampling_params(req, max_tokens, stops)
    responses = await asyncio.gather(*[
        sample(backend, served, types.ModelInput.from_ints(p), req.n, params) for p in prompts])
    choices = [_completion_choice(i * req.n + j, seq, stops, served.tokenizer)
               for i, response in enumerate(responses) for j, seq in enumerate(response.sequences)]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": req.model}
    usage = token_usage(sum(map(len, prompts)), sum(len(seq.tokens) for r in responses for seq in r.sequences))

    def logprobs(choice: Choice) -> dict[str, Any] | None:
        return _completion_logprobs(choice, served.tokenizer) if req.logprobs is not None else None

    if not req.stream:
        return JSONResponse({**head, "choices": [
            {"index": c.index, "text": c.text, "logprobs": logprobs(c), "finish_reason": c.finish_reason}
            for c in choices], "usage": usage}, headers=headers)

    async def events() -> AsyncIterator[bytes]:
        for c in choices:
            for k, piece in enumerate(stream_pieces(c.text)):
                yield sse({**head, "choices": [{"index": c.index, "text": piece,
                                                "logprobs": logprobs(c) if k == 0 else None,
                                                "finish_reason": None}]})
            yield sse({**head, "choices": [{"index": c.index, "text": "", "logprobs": None,
                                            "finish_reason": c.finish_reason}]})
        if req.stream_options and req.stream_options.include_usage:
            yield sse({**head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
