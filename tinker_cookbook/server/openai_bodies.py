"""The request bodies of the OpenAI-compatible routes (``openai_api``), as strict pydantic models, and the checks
both routes share: parsing a body, refusing what the engine cannot do, the ``Warning`` header of ignored fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tinker_cookbook.server.app import ServerLimits, describe_validation_errors
from tinker_cookbook.server.json_input import read_json
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

OWNER = "tinker-cookbook"


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
    # The rest of OpenAI's schema: ignored (IGNORED) or refused with a reason (openai_routes.chat._check_chat).
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


def parse(model: type[_SamplingRequest], raw: bytes) -> Any:
    """The request body as ``model``; BadRequestError naming every bad field."""
    data = read_json(raw)
    if not isinstance(data, dict):
        raise BadRequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, _ = describe_validation_errors(list(exc.errors()))  # type: ignore[arg-type]
        raise BadRequestError(message) from None


def unsupported(name: str, value: Any, why: str) -> BadRequestError:
    return BadRequestError(f"{name}={value!r} is not supported: {why}")


def check_common(req: _SamplingRequest, prompts: int, limits: ServerLimits) -> list[str]:
    """Refuse what the engine cannot do and what exceeds the limits; returns the user stop strings."""
    if req.presence_penalty or req.frequency_penalty:
        name = "presence_penalty" if req.presence_penalty else "frequency_penalty"
        raise unsupported(name, getattr(req, name), "the local sampler has no penalties; remove it or pass 0")
    if req.logit_bias:
        raise unsupported("logit_bias", req.logit_bias, "the local sampler cannot bias logits; remove it")
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


def sampling_params(req: _SamplingRequest, max_tokens: int | None, stop: list[str] | list[int]
                    ) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                top_k=req.top_k, seed=req.seed, stop=stop or None)
