"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``.

The model of a request is a base model the backend serves (see ``GET /v1/models``) or a ``tinker://`` sampler
checkpoint path. Every request becomes one ``backend.sample`` call per prompt with ``num_samples = n``, so the
engine's sampler batches a request's samples, and concurrent requests, together.

Chat messages are rendered with this project's renderers (not a Jinja chat template): by default the renderer
stored with a checkpoint's training run, else the model's recommended one; the extra body field ``renderer``
picks another (``extra_body={"renderer": "role_colon"}`` in the OpenAI client). Sampling stops at the
renderer's stop sequences and at the request's ``stop`` strings; the reply is parsed by the renderer, and
reasoning (Qwen3's ``<think>``) comes back as ``message.reasoning_content``.

Supported: ``n``, ``temperature``, ``top_p``, ``top_k`` (extension), ``max_tokens`` / ``max_completion_tokens``,
``stop``, ``seed``, ``stream`` (with ``stream_options.include_usage``), the logprobs of the sampled tokens
(completions ``logprobs=0``; chat ``logprobs=true`` with ``top_logprobs`` 0 or unset), and tool calling through the
renderer's tool format (``tools``, ``tool_choice``, ``tool`` messages, ``tool_calls`` both ways). Every other field
of OpenAI's request schema is accepted too: those that do not change sampling here are ignored and named in the
reply's ``Warning`` header (``IGNORED`` of each body class); those this engine cannot honour (penalties,
``logit_bias``, ``echo``, ``suffix``, ``best_of`` > ``n``, top alternatives of logprobs, JSON response formats,
audio, web search) get a 400 that says so. Fields outside OpenAI's schema get a 400 too.

Streaming samples the whole completion first, then sends it as Server-Sent Events in OpenAI's chunk format.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tinker_cookbook import model_info, renderers
from tinker_cookbook.checkpoint_utils import RENDERER_NAME_METADATA_KEY
from tinker_cookbook.exceptions import ConfigurationError, RendererError
from tinker_cookbook.renderers.messages import get_tool_calls, get_unparsed_tool_calls
from tinker_cookbook.renderers.stops import cut_at_stop_strings, merge_stop_sequences
from tinker_cookbook.server.app import ServerLimits, describe_validation_errors, error_response
from tinker_cookbook.server.json_input import read_json
from tinker_cookbook.tinker import SamplingClient, types
from tinker_cookbook.tinker.backend import Backend, SamplerHandle
from tinker_cookbook.tinker.errors import BadRequestError, NotFoundError, TinkerError

TINKER_PATH_PREFIX = "tinker://"
OWNER = "tinker-cookbook"
MAX_CACHED_CHECKPOINTS = 8
"""Sampler checkpoints kept loaded; each holds its adapter's weights, so the least recently used goes first."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default for ``/v1/completions``; chat defaults to the sampler's (up to the context end)."""


# ---------------------------------------------------------------------------------------------------------
# Request bodies (unknown fields are refused)
# ---------------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    # strict: no coercion, so n="2", max_tokens=true or logprobs="true" are refused rather than guessed at.
    model_config = ConfigDict(extra="forbid", strict=True)

    IGNORED: ClassVar[frozenset[str]] = frozenset()
    """Fields of OpenAI's schema that do not change sampling here: accepted (type-checked), then ignored and
    named in the reply's ``Warning`` header when they hold a value."""


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None

    IGNORED = frozenset({"include_obfuscation"})


class _SamplingRequest(_Strict):
    model: str = Field(min_length=1)
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="extension: -1 or 0 for no cut")
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    IGNORED = frozenset({"user"})


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class ContentPartIn(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # other part types are refused below, by name
    type: str
    text: str | None = None


TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
"""OpenAI's rule for function names (it also keeps them safe to write into a renderer's tool-call format)."""


class FunctionCallIn(_Strict):
    name: str = Field(pattern=TOOL_NAME)
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"]
    function: FunctionCallIn


class ChatMessageIn(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPartIn] | None = None
    name: str | None = None  # the renderers have no speaker names
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # what this server returns: sent back, it is the turn's reasoning
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None

    IGNORED = frozenset({"name", "refusal", "annotations"})


class FunctionIn(_Strict):
    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    IGNORED = frozenset({"strict"})


class ToolIn(_Strict):
    type: Literal["function"]
    function: FunctionIn


class NamedFunction(_Strict):
    name: str = Field(pattern=TOOL_NAME)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(_SamplingRequest):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    renderer: str | None = Field(None, description="extension: a renderer name instead of the model's default")
    response_format: dict[str, Any] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # The rest of OpenAI's schema: ignored (IGNORED) or refused with a reason (_check_chat).
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    IGNORED = frozenset({
        "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
        "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "reasoning_effort", "verbosity",
        "prediction", "moderation",
    })


def ignored_fields(value: Any, where: str = "") -> list[str]:
    """Where ``value`` (a parsed body) sets fields that are accepted but ignored, as ``messages[1].refusal``."""
    found: list[str] = []
    if isinstance(value, _Strict):
        for name in sorted(value.model_fields_set):
            path = f"{where}.{name}" if where else name
            if getattr(value, name) is None:
                continue  # a null asks for nothing, so ignoring it changes nothing
            if name in value.IGNORED:
                found.append(path)
            else:
                found += ignored_fields(getattr(value, name), path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += ignored_fields(item, f"{where}[{i}]")
    elif isinstance(value, ContentPartIn) and value.type == "refusal":
        found.append(where)  # an assistant turn's refusal part, as OpenAI returns them: not text the model saw
    return found


def warning_headers(req: _Strict) -> dict[str, str]:
    """A ``Warning`` header naming the ignored fields the request set (none when it set none)."""
    names = ignored_fields(req)
    if not names:
        return {}
    return {"Warning": f'299 {OWNER} "ignored, as they do not change sampling here: {", ".join(names)}"'}


def _parse(model: type[_SamplingRequest], raw: bytes) -> Any:
    """The request body as ``model``; BadRequestError naming every bad field."""
    data = read_json(raw)
    if not isinstance(data, dict):
        raise BadRequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, _ = describe_validation_errors(list(exc.errors()))  # type: ignore[arg-type]
        raise BadRequestError(message) from None


def _unsupported(name: str, value: Any, why: str) -> BadRequestError:
    return BadRequestError(f"{name}={value!r} is not supported: {why}")


def _check_common(req: _SamplingRequest, prompts: int, limits: ServerLimits) -> list[str]:
    """Refuse what the engine cannot do and what exceeds the limits; returns the user stop strings."""
    if req.presence_penalty or req.frequency_penalty:
        name = "presence_penalty" if req.presence_penalty else "frequency_penalty"
        raise _unsupported(name, getattr(req, name), "the local sampler has no penalties; remove it or pass 0")
    if req.logit_bias:
        raise _unsupported("logit_bias", req.logit_bias, "the local sampler cannot bias logits; remove it")
    if req.n > limits.max_n:
        raise BadRequestError(f"n={req.n} is above this server's limit of {limits.max_n}; send several requests")
    if req.n * prompts > limits.max_samples_per_request:
        raise BadRequestError(
            f"{prompts} prompt(s) x n={req.n} = {req.n * prompts} samples is above this server's limit of "
            f"{limits.max_samples_per_request} per request; split the prompts over several requests"
        )
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > limits.max_stop_sequences:
        raise BadRequestError(f"stop has {len(stops)} strings, above the limit of {limits.max_stop_sequences}")
    if any(not s for s in stops):
        raise BadRequestError(f"stop={stops!r} holds an empty string; remove it")
    return stops


def _sampling_params(req: _SamplingRequest, max_tokens: int | None, stop: list[str] | list[int]
                     ) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                top_k=req.top_k, seed=req.seed, stop=stop or None)


# ---------------------------------------------------------------------------------------------------------
# Models: base models and sampler checkpoints, loaded on first use
# ---------------------------------------------------------------------------------------------------------


@dataclass
class ServedModel:
    """A model the server samples from, with its tokenizer and the renderers built for it so far."""

    name: str
    handle: SamplerHandle
    tokenizer: Any
    base_model: str
    stored_renderer: str | None
    built_renderers: dict[str, renderers.Renderer] = field(default_factory=dict)

    def renderer_name(self, requested: str | None) -> str:
        """The renderer a request gets: the one it names, else the checkpoint's, else the model's default."""
        name = requested or self.stored_renderer
        if name is not None:
            return name
        try:
            return model_info.get_recommended_renderer_name(self.base_model)
        except ConfigurationError as exc:
            raise BadRequestError(
                f"no default renderer for {self.base_model!r}: pass one as the body field 'renderer' "
                f"(one of {renderers.get_registered_renderer_names()})"
            ) from exc

    def renderer(self, requested: str | None) -> renderers.Renderer:
        name = self.renderer_name(requested)
        if name not in self.built_renderers:
            try:
                self.built_renderers[name] = renderers.get_renderer(name, self.tokenizer, model_name=self.base_model)
            except RendererError as exc:
                raise BadRequestError(f"renderer={name!r}: {exc}") from None
        return self.built_renderers[name]


class ModelRegistry:
    """Resolves a request's ``model`` to a loaded model; loads each at most once (checkpoints: a small LRU)."""

    def __init__(self, backend: Backend[Any]) -> None:
        self.backend = backend
        self._base: dict[str, ServedModel] = {}
        self._checkpoints: OrderedDict[str, ServedModel] = OrderedDict()
        self._loading: dict[str, asyncio.Lock] = {}
        self._known_bases: set[str] | None = None

    def base_model_names(self, refresh: bool = False) -> list[str]:
        """The base models the backend can serve (models it can load without the network)."""
        if refresh or self._known_bases is None:
            supported = self.backend.capabilities().supported_models
            self._known_bases = {m.model_name for m in supported if m.model_name}
        return sorted(self._known_bases)

    def loaded_checkpoints(self) -> list[str]:
        return list(self._checkpoints)

    def preload(self, name: str) -> ServedModel:
        """Load ``name`` now, before serving (blocking; for ``serve --model``)."""
        return asyncio.run(self.get(name))

    async def get(self, name: str) -> ServedModel:
        served = self._checkpoints.get(name) or self._base.get(name)
        if served is not None:
            if name in self._checkpoints:
                self._checkpoints.move_to_end(name)
            return served
        lock = self._loading.setdefault(name, asyncio.Lock())
        async with lock:  # concurrent first requests for one model load it once
            served = self._checkpoints.get(name) or self._base.get(name)
            if served is None:
                served = await self._load(name)
        self._loading.pop(name, None)
        return served

    async def _load(self, name: str) -> ServedModel:
        if name.startswith(TINKER_PATH_PREFIX):
            handle = await asyncio.to_thread(self.backend.handle_for_path, name)
            served = self._served(name, handle, self._stored_renderer(name))
            self._checkpoints[name] = served
            while len(self._checkpoints) > MAX_CACHED_CHECKPOINTS:
                self._checkpoints.popitem(last=False)
            return served
        # Only models the backend lists: a remote client must not make the server fetch arbitrary names.
        if name not in self.base_model_names() and name not in self.base_model_names(refresh=True):
            raise NotFoundError(
                f"model={name!r} is not served here; use one of {self.base_model_names()} or a "
                "tinker://RUN/sampler_weights/NAME checkpoint path (GET /v1/models lists them)"
            )
        handle = await asyncio.to_thread(self.backend.handle_for_base, name)
        served = self._served(name, handle, None)
        self._base[name] = served
        return served

    def _served(self, name: str, handle: SamplerHandle, stored_renderer: str | None) -> ServedModel:
        client = SamplingClient(self.backend, handle)  # the public accessors of the opaque handle
        return ServedModel(name=name, handle=handle, tokenizer=client.get_tokenizer(),
                           base_model=client.get_base_model(), stored_renderer=stored_renderer)

    def _stored_renderer(self, tinker_path: str) -> str | None:
        """The renderer the checkpoint's run was trained with, when its metadata records one."""
        try:
            run_id = types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path).training_run_id
            run = self.backend.store.get_run(run_id)
        except (TinkerError, ValueError):
            return None
        return (run.user_metadata or {}).get(RENDERER_NAME_METADATA_KEY)


# ---------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------


async def _sample(backend: Backend[Any], served: ServedModel, prompt: types.ModelInput, n: int,
                  params: types.SamplingParams) -> types.SampleResponse:
    future = backend.sample(served.handle, prompt, n, params, False, 0)  # validation errors raise here
    # If the client goes away, cancelling this await cancels the request; the sampler skips cancelled futures.
    return await asyncio.wrap_future(future)


def _token_pieces(tokenizer: Any, tokens: Sequence[int]) -> list[str]:
    return [str(tokenizer.decode([t], skip_special_tokens=False)) for t in tokens]


def _tokens_within(pieces: list[str], length: int) -> int:
    """How many leading tokens (by their decoded pieces) start inside the first ``length`` characters."""
    count, offset = 0, 0
    for piece in pieces:
        if offset >= length:
            break
        offset += len(piece)
        count += 1
    return count


@dataclass
class _Choice:
    index: int
    text: str
    finish_reason: str
    tokens: list[int]
    """The sampled tokens the text comes from (for logprobs)."""
    logprobs: list[float]
    reasoning: str | None = None
    tool_calls: list[_ToolCallOut] = field(default_factory=list)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


_PIECES = re.compile(r"\S+\s*|\s+")


def _stream_pieces(text: str) -> list[str]:
    """The text in word-sized pieces for streaming (their concatenation is the text)."""
    return _PIECES.findall(text)


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# ---------------------------------------------------------------------------------------------------------
# /v1/completions
# ---------------------------------------------------------------------------------------------------------


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
        raise _unsupported("echo", True, "this server returns only the completion; send echo=false")
    if req.suffix:
        raise _unsupported("suffix", req.suffix, "the local sampler does not insert text; remove it")
    if req.best_of is not None and req.best_of != req.n:
        raise _unsupported("best_of", req.best_of, f"only best_of == n (n={req.n}) or unset is supported")
    if req.logprobs:
        raise _unsupported("logprobs", req.logprobs, "the local sampler reports the sampled tokens' logprobs but "
                           "not the top alternatives; use logprobs=0")


def _completion_choice(index: int, seq: types.SampledSequence, stops: list[str], tokenizer: Any) -> _Choice:
    tokens = list(seq.tokens)
    eos = getattr(tokenizer, "eos_token_id", None)
    if seq.stop_reason == "stop" and tokens and tokens[-1] == eos:
        tokens = tokens[:-1]  # the end-of-sequence token is not part of the text
    text, cut = cut_at_stop_strings(str(tokenizer.decode(tokens, skip_special_tokens=False)), stops)
    finish = "stop" if cut or seq.stop_reason == "stop" else "length"
    return _Choice(index=index, text=text, finish_reason=finish, tokens=tokens, logprobs=list(seq.logprobs or []))


def _completion_logprobs(choice: _Choice, tokenizer: Any) -> dict[str, Any]:
    pieces = _token_pieces(tokenizer, choice.tokens)
    kept = _tokens_within(pieces, len(choice.text))
    offsets, offset = [], 0
    for piece in pieces[:kept]:
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": pieces[:kept], "token_logprobs": choice.logprobs[:kept], "top_logprobs": None,
            "text_offset": offsets}


async def completions(request: Request, backend: Backend[Any], registry: ModelRegistry,
                      limits: ServerLimits) -> Any:
    req: CompletionRequest = _parse(CompletionRequest, await request.body())
    _check_completion(req)
    stops = _check_common(req, _prompt_count(req.prompt), limits)
    headers = warning_headers(req)
    served = await registry.get(req.model)
    prompts = _completion_prompts(req.prompt, served.tokenizer)
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    params = _sampling_params(req, max_tokens, stops)
    responses = await asyncio.gather(*[
        _sample(backend, served, types.ModelInput.from_ints(p), req.n, params) for p in prompts])
    choices = [_completion_choice(i * req.n + j, seq, stops, served.tokenizer)
               for i, response in enumerate(responses) for j, seq in enumerate(response.sequences)]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": req.model}
    usage = _usage(sum(map(len, prompts)), sum(len(seq.tokens) for r in responses for seq in r.sequences))

    def logprobs(choice: _Choice) -> dict[str, Any] | None:
        return _completion_logprobs(choice, served.tokenizer) if req.logprobs is not None else None

    if not req.stream:
        return JSONResponse({**head, "choices": [
            {"index": c.index, "text": c.text, "logprobs": logprobs(c), "finish_reason": c.finish_reason}
            for c in choices], "usage": usage}, headers=headers)

    async def events() -> AsyncIterator[bytes]:
        for c in choices:
            for k, piece in enumerate(_stream_pieces(c.text)):
                yield _sse({**head, "choices": [{"index": c.index, "text": piece,
                                                 "logprobs": logprobs(c) if k == 0 else None,
                                                 "finish_reason": None}]})
            yield _sse({**head, "choices": [{"index": c.index, "text": "", "logprobs": None,
                                             "finish_reason": c.finish_reason}]})
        if req.stream_options and req.stream_options.include_usage:
            yield _sse({**head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={**_SSE_HEADERS, **headers})


# ---------------------------------------------------------------------------------------------------------
# /v1/chat/completions
# ---------------------------------------------------------------------------------------------------------


JSON_FORMATS = ("json_object", "json_schema")


def _check_chat(req: ChatRequest) -> None:
    if req.response_format is not None and req.response_format.get("type") != "text":
        kind = req.response_format.get("type")
        why = ("this server has no constrained decoding, so it cannot guarantee JSON; ask for JSON in the "
               "messages and parse the reply, or remove response_format" if kind in JSON_FORMATS
               else "only {'type': 'text'} is supported")
        raise _unsupported("response_format", {"type": kind}, why)
    if req.functions is not None or req.function_call is not None:
        name = "functions" if req.functions is not None else "function_call"
        raise BadRequestError(f"{name} is OpenAI's deprecated form of tool calling; send tools and tool_choice")
    if req.audio is not None or (req.modalities is not None and req.modalities != ["text"]):
        raise _unsupported("modalities" if req.audio is None else "audio", req.modalities or req.audio,
                           "this server answers with text only; remove it or send modalities=['text']")
    if req.web_search_options is not None:
        raise _unsupported("web_search_options", req.web_search_options, "this server has no web search")
    if req.top_logprobs and not req.logprobs:
        raise BadRequestError("top_logprobs needs logprobs=true")
    if req.top_logprobs:
        raise _unsupported("top_logprobs", req.top_logprobs, "the local sampler reports the sampled tokens' "
                           "logprobs but not the top alternatives; use logprobs=true with top_logprobs=0")
    _check_tool_choice(req)
    for i, m in enumerate(req.messages):
        _check_message(i, m)


def _check_tool_choice(req: ChatRequest) -> None:
    choice = req.tool_choice
    if isinstance(choice, dict):  # not one of the shapes served: name its type
        raise _unsupported("tool_choice", choice, "only 'none', 'auto', 'required' or "
                           "{'type': 'function', 'function': {'name': ...}} are supported")
    if choice in ("required", None, "none", "auto") and (choice != "required" or req.tools):
        return
    if not req.tools:
        raise BadRequestError(f"tool_choice={_choice_repr(choice)} needs tools; declare the functions in tools")
    names = [t.function.name for t in req.tools]
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise BadRequestError(f"tool_choice names the function {choice.function.name!r}, which is not in tools "
                              f"({names})")


def _choice_repr(choice: Any) -> str:
    return repr(choice.model_dump() if isinstance(choice, BaseModel) else choice)


def _check_message(i: int, m: ChatMessageIn) -> None:
    where = f"messages[{i}]"
    if m.role != "assistant":
        for name in ("tool_calls", "reasoning_content", "refusal", "annotations", "audio", "function_call"):
            if getattr(m, name) is not None:
                raise BadRequestError(f"{where}.{name} is only allowed on assistant messages (role is {m.role!r})")
    if m.role == "tool" and m.tool_call_id is None:
        raise BadRequestError(f"{where} is a tool message without tool_call_id; give the id of the call it answers")
    if m.role != "tool" and m.tool_call_id is not None:
        raise BadRequestError(f"{where}.tool_call_id is only allowed on tool messages (role is {m.role!r})")
    if m.audio is not None or m.function_call is not None:
        name = "audio" if m.audio is not None else "function_call"
        raise _unsupported(f"{where}.{name}", getattr(m, name), "this server has no audio and no deprecated "
                           "function_call turns; send text content and tool_calls")
    for j, call in enumerate(m.tool_calls or []):
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise BadRequestError(f"{where}.tool_calls[{j}].function.arguments must be a JSON object string, "
                                  f"got {call.function.arguments!r:.100}")


def _text(i: int, m: ChatMessageIn) -> str:
    content = m.content
    if not isinstance(content, list):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type == "refusal" and m.role == "assistant":
            continue  # ignored (named in the Warning header)
        if part.type != "text" or part.text is None:
            raise BadRequestError(
                f"messages[{i}].content[{j}] has type {part.type!r}: only text parts "
                "({'type': 'text', 'text': ...}) are supported"
            )
        texts.append(part.text)
    return "".join(texts)


def _chat_messages(messages: list[ChatMessageIn]) -> list[renderers.Message]:
    out: list[renderers.Message] = []
    for i, m in enumerate(messages):
        text = _text(i, m)
        role = "system" if m.role == "developer" else m.role  # OpenAI's newer name for the system message
        message = renderers.Message(role=role, content=text)
        if m.reasoning_content is not None:
            message["content"] = [renderers.ThinkingPart(type="thinking", thinking=m.reasoning_content),
                                  renderers.TextPart(type="text", text=text)]
        if m.tool_calls:
            message["tool_calls"] = [
                renderers.ToolCall(id=c.id, function=renderers.FunctionBody(name=c.function.name,
                                                                            arguments=c.function.arguments))
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _with_tools(req: ChatRequest, messages: list[renderers.Message], renderer: renderers.Renderer,
                renderer_name: str) -> tuple[list[renderers.Message], str]:
    """The conversation with ``tools`` declared as the renderer does it, and the text that must open the reply
    ("" unless ``tool_choice`` is "required" or names a function)."""
    if not req.tools or req.tool_choice == "none":
        return messages, ""  # "none": the model is not shown the tools, so it answers in text
    specs = [renderers.ToolSpec(name=t.function.name, description=t.function.description,
                                parameters=t.function.parameters or {"type": "object", "properties": {}})
             for t in req.tools]
    system = ""
    if messages and messages[0]["role"] == "system":  # the declaration goes after the system prompt, in one turn
        system, messages = renderers.get_text_content(messages[0]), messages[1:]
    forced = req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None
    try:
        prefix = renderer.create_conversation_prefix_with_tools(specs, system)
        opening = renderer.tool_call_prefix(forced) if req.tool_choice == "required" or forced else ""
    except RendererError as exc:
        raise BadRequestError(f"tools: model {req.model!r} is served with the renderer {renderer_name!r}, "
                              f"which has no tool-calling format ({exc}); pass a renderer with one "
                              "(extra body field 'renderer', e.g. 'qwen3') or remove tools") from None
    return [*prefix, *messages], opening


@dataclass
class _ToolCallOut:
    id: str
    name: str
    arguments: str

    def as_json(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _chat_choice(index: int, seq: types.SampledSequence, stops: list[str], renderer: renderers.Renderer,
                 opening: list[int], tool_calls_allowed: bool) -> _Choice:
    parsed, _termination = renderer.parse_response([*opening, *seq.tokens])
    # A call block that does not parse (bad JSON, cut off by max_tokens) stays visible as text.
    unparsed = [c.raw_text for c in get_unparsed_tool_calls(parsed)]
    text, cut = cut_at_stop_strings("\n".join([renderers.get_text_content(parsed), *unparsed]).strip("\n")
                                    if unparsed else renderers.get_text_content(parsed), stops)
    finish = "stop" if cut or seq.stop_reason == "stop" else "length"
    calls = [_ToolCallOut(id=c.id or f"call_{uuid.uuid4().hex[:24]}", name=c.function.name,
                          arguments=c.function.arguments)
             for c in get_tool_calls(parsed)] if tool_calls_allowed and not cut else []
    if calls and finish == "stop":
        finish = "tool_calls"
    content_tokens = list(seq.tokens)
    if seq.stop_reason == "stop" and content_tokens:
        content_tokens = content_tokens[:-1]  # the stop token, or the one that completed a stop string
    return _Choice(index=index, text=text, finish_reason=finish, tokens=content_tokens,
                   logprobs=list(seq.logprobs or [])[:len(content_tokens)],
                   reasoning=renderers.get_thinking_content(parsed), tool_calls=calls)


def _chat_logprobs(choice: _Choice, tokenizer: Any) -> dict[str, Any]:
    pieces = _token_pieces(tokenizer, choice.tokens)
    return {"content": [{"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
                        for piece, lp in zip(pieces, choice.logprobs, strict=False)]}


async def chat_completions(request: Request, backend: Backend[Any], registry: ModelRegistry,
                           limits: ServerLimits) -> Any:
    req: ChatRequest = _parse(ChatRequest, await request.body())
    _check_chat(req)
    stops = _check_common(req, 1, limits)
    headers = warning_headers(req)
    served = await registry.get(req.model)
    renderer_name = served.renderer_name(req.renderer)
    renderer = served.renderer(req.renderer)
    messages, opening_text = _with_tools(req, _chat_messages(req.messages), renderer, renderer_name)
    try:
        prompt = renderer.build_generation_prompt(messages)
    except RendererError as exc:
        raise BadRequestError(f"messages cannot be rendered for model {req.model!r} with the renderer "
                              f"{renderer_name!r} ({type(renderer).__name__}): {exc}") from None
    opening = renderer.encode(opening_text)  # a forced tool call: the reply starts with it
    if opening:
        prompt = prompt.append(types.EncodedTextChunk(tokens=opening))
    stop = merge_stop_sequences(renderer.get_stop_sequences(), stops, served.tokenizer)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    response = await _sample(backend, served, prompt, req.n, _sampling_params(req, max_tokens, stop))
    choices = [_chat_choice(j, seq, stops, renderer, opening, req.tool_choice != "none")
               for j, seq in enumerate(response.sequences)]
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model}
    usage = _usage(prompt.length, sum(len(seq.tokens) for seq in response.sequences))

    def logprobs(choice: _Choice) -> dict[str, Any] | None:
        return _chat_logprobs(choice, served.tokenizer) if req.logprobs else None

    def message(choice: _Choice) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.reasoning is not None:
            out["reasoning_content"] = choice.reasoning
        if choice.tool_calls:
            out["tool_calls"] = [call.as_json() for call in choice.tool_calls]
        return out

    if not req.stream:
        return JSONResponse({**head, "object": "chat.completion", "choices": [
            {"index": c.index, "message": message(c), "logprobs": logprobs(c), "finish_reason": c.finish_reason}
            for c in choices], "usage": usage}, headers=headers)

    chunk_head = {**head, "object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> bytes:
        return _sse({**chunk_head, "choices": [{"index": index, "delta": delta, "logprobs": lp,
                                                "finish_reason": finish}]})

    async def events() -> AsyncIterator[bytes]:
        for c in choices:
            yield chunk(c.index, {"role": "assistant", "content": ""}, lp=logprobs(c))
            for piece in _stream_pieces(c.reasoning or ""):
                yield chunk(c.index, {"reasoning_content": piece})
            for piece in _stream_pieces(c.text):
                yield chunk(c.index, {"content": piece})
            if c.tool_calls:
                yield chunk(c.index, {"tool_calls": [call.as_json(k) for k, call in enumerate(c.tool_calls)]})
            yield chunk(c.index, {}, c.finish_reason)
        if req.stream_options and req.stream_options.include_usage:
            yield _sse({**chunk_head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={**_SSE_HEADERS, **headers})


# ---------------------------------------------------------------------------------------------------------
# /v1/models and the router
# ---------------------------------------------------------------------------------------------------------


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": OWNER}


def build_router(backend: Backend[Any], limits: ServerLimits | None = None,
                 registry: ModelRegistry | None = None) -> APIRouter:
    """The OpenAI-compatible routes over ``backend`` (``registry``: the loaded models, to share or preload)."""
    limits = limits or ServerLimits()
    registry = registry or ModelRegistry(backend)
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def list_models() -> Any:
        names = [*registry.base_model_names(refresh=True), *registry.loaded_checkpoints()]
        return {"object": "list", "data": [_model_card(n) for n in names]}

    @router.get("/models/{model:path}")
    async def get_model(model: str) -> Any:
        if model in registry.base_model_names() or model in registry.loaded_checkpoints():
            return _model_card(model)
        return error_response(404, f"model {model!r} is not served here; GET /v1/models lists the models "
                                   "(a tinker:// checkpoint is listed once a request has used it)", "model")

    @router.post("/completions")
    async def create_completion(request: Request) -> Any:
        return await completions(request, backend, registry, limits)

    @router.post("/chat/completions")
    async def create_chat_completion(request: Request) -> Any:
        return await chat_completions(request, backend, registry, limits)

    return router
