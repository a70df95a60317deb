"""``/v1/chat/completions``: messages rendered with this project's renderers, tools declared and tool calls parsed
in the renderer's format, the reply parsed into content, reasoning and tool calls."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.messages import get_tool_calls, get_unparsed_tool_calls
from tinker_cookbook.renderers.stops import cut_at_stop_strings, merge_stop_sequences
from tinker_cookbook.server.app import ServerLimits
from tinker_cookbook.server.openai_bodies import (
    ChatMessageIn,
    ChatRequest,
    NamedToolChoice,
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
    ToolCallOut,
    sample,
    sse,
    stream_pieces,
    token_pieces,
    token_usage,
)
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.backend import Backend
from tinker_cookbook.tinker.errors import BadRequestError

JSON_FORMATS = ("json_object", "json_schema")


def _check_chat(req: ChatRequest) -> None:
    if req.response_format is not None and req.response_format.get("type") != "text":
        kind = req.response_format.get("type")
        why = ("this server has no constrained decoding, so it cannot guarantee JSON; ask for JSON in the "
               "messages and parse the reply, or remove response_format" if kind in JSON_FORMATS
               else "only {'type': 'text'} is supported")
        raise unsupported("response_format", {"type": kind}, why)
    if req.functions is not None or req.function_call is not None:
        name = "functions" if req.functions is not None else "function_call"
        raise BadRequestError(f"{name} is OpenAI's deprecated form of tool calling; send tools and tool_choice")
    if req.audio is not None or (req.modalities is not None and req.modalities != ["text"]):
        raise unsupported("modalities" if req.audio is None else "audio", req.modalities or req.audio,
                          "this server answers with text only; remove it or send modalities=['text']")
    if req.web_search_options is not None:
        raise unsupported("web_search_options", req.web_search_options, "this server has no web search")
    if req.top_logprobs and not req.logprobs:
        raise BadRequestError("top_logprobs needs logprobs=true")
    if req.top_logprobs:
        raise unsupported("top_logprobs", req.top_logprobs, "the local sampler reports the sampled tokens' "
                          "logprobs but not the top alternatives; use logprobs=true with top_logprobs=0")
    _check_tool_choice(req)
    for i, m in enumerate(req.messages):
        _check_message(i, m)


def _check_tool_choice(req: ChatRequest) -> None:
    choice = req.tool_choice
    if isinstance(choice, dict):  # not one of the shapes served: name its type
        raise unsupported("tool_choice", choice, "only 'none', 'auto', 'required' or "
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
        raise unsupported(f"{where}.{name}", getattr(m, name), "this server has no audio and no deprecated "
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

def _chat_choice(index: int, seq: types.SampledSequence, stops: list[str], renderer: renderers.Renderer,
                 opening: list[int], tool_calls_allowed: bool) -> Choice:
    parsed, _termination = renderer.parse_response([*opening, *seq.tokens])
    # A call block that does not parse (bad JSON, cut off by max_tokens) stays visible as text.
    unparsed = [c.raw_text for c in get_unparsed_tool_calls(parsed)]
    text, cut = cut_at_stop_strings("\n".join([renderers.get_text_content(parsed), *unparsed]).strip("\n")
                                    if unparsed else renderers.get_text_content(parsed), stops)
    finish = "stop" if cut or seq.stop_reason == "stop" else "length"
    calls = [ToolCallOut(id=c.id or f"call_{uuid.uuid4().hex[:24]}", name=c.function.name,
                         arguments=c.function.arguments)
             for c in get_tool_calls(parsed)] if tool_calls_allowed and not cut else []
    if calls and finish == "stop":
        finish = "tool_calls"
    content_tokens = list(seq.tokens)
    if seq.stop_reason == "stop" and content_tokens:
        content_tokens = content_tokens[:-1]  # the stop token, or the one that completed a stop string
    return Choice(index=index, text=text, finish_reason=finish, tokens=content_tokens,
                  logprobs=list(seq.logprobs or [])[:len(content_tokens)],
                  reasoning=renderers.get_thinking_content(parsed), tool_calls=calls)


def _chat_logprobs(choice: Choice, tokenizer: Any) -> dict[str, Any]:
    pieces = token_pieces(tokenizer, choice.tokens)
    return {"content": [{"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
                        for piece, lp in zip(pieces, choice.logprobs, strict=False)]}


async def chat_completions(request: Request, backend: Backend[Any], registry: ModelRegistry,
                           limits: ServerLimits) -> Any:
    req: ChatRequest = parse(ChatRequest, await request.body())
    _check_chat(req)
    stops = check_common(req, 1, limits)
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
    response = await sample(backend, served, prompt, req.n, sampling_params(req, max_tokens, stop))
    choices = [_chat_choice(j, seq, stops, renderer, opening, req.tool_choice != "none")
               for j, seq in enumerate(response.sequences)]
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model}
    usage = token_usage(prompt.length, sum(len(seq.tokens) for seq in response.sequences))

    def logprobs(choice: Choice) -> dict[str, Any] | None:
        return _chat_logprobs(choice, served.tokenizer) if req.logprobs else None

    def message(choice: Choice) -> dict[str, Any]:
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
        return sse({**chunk_head, "choices": [{"index": index, "delta": delta, "logprobs": lp,
                                               "finish_reason": finish}]})

    async def events() -> AsyncIterator[bytes]:
        for c in choices:
            yield chunk(c.index, {"role": "assistant", "content": ""}, lp=logprobs(c))
            for piece in stream_pieces(c.reasoning or ""):
                yield chunk(c.index, {"reasoning_content": piece})
            for piece in stream_pieces(c.text):
                yield chunk(c.index, {"content": piece})
            if c.tool_calls:
                yield chunk(c.index, {"tool_calls": [call.as_json(k) for k, call in enumerate(c.tool_calls)]})
            yield chunk(c.index, {}, c.finish_reason)
        if req.stream_options and req.stream_options.include_usage:
            yield sse({**chunk_head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
