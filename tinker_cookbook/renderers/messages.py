"""Conversation types (``Message`` and its parts, tool calls, ``TrainOnWhat``, ``ParseTermination``), helpers
to read message content, and conversation validation.

``Message`` and the content parts are TypedDicts, so plain dicts (e.g. from JSONL files) work as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypeAlias, TypedDict

from pydantic import BaseModel, ConfigDict

from tinker_cookbook.exceptions import RendererError

if TYPE_CHECKING:
    from PIL import Image

# ---------------------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------------------

Role: TypeAlias = str
"""``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``."""

KNOWN_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


class TextPart(TypedDict):
    type: Literal["text"]
    text: str


class ThinkingPart(TypedDict):
    type: Literal["thinking"]
    thinking: str


class ImagePart(TypedDict):
    type: Literal["image"]
    image: str | bytes | Image.Image
    """An http(s) URL, a ``data:`` URI, a file path, encoded PNG/JPEG bytes, or a PIL image."""


ContentPart: TypeAlias = TextPart | ThinkingPart | ImagePart
Content: TypeAlias = str | list[ContentPart]


class FunctionBody(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    arguments: str
    """The arguments as a JSON object string, as in the OpenAI API."""


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    function: FunctionBody
    id: str | None = None
    type: Literal["function"] = "function"


class UnparsedToolCall(BaseModel):
    """A tool call the model attempted but that could not be parsed; ``raw_text`` is what it wrote."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    raw_text: str
    error: str


class ToolSpec(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]
    """A JSON schema of the arguments object."""


class Message(TypedDict):
    role: Role
    content: Content
    tool_calls: NotRequired[list[ToolCall]]
    unparsed_tool_calls: NotRequired[list[UnparsedToolCall]]
    trainable: NotRequired[bool]
    """Whether this message is trained on; read only with ``TrainOnWhat.CUSTOMIZED``."""
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


class TrainOnWhat(StrEnum):
    """Which tokens of a conversation ``build_supervised_example`` gives weight 1 (all others get 0)."""

    LAST_ASSISTANT_MESSAGE = "last_assistant_message"
    LAST_ASSISTANT_TURN = "last_assistant_turn"
    """Every assistant message after the last user message (tool calls and the final answer)."""
    ALL_ASSISTANT_MESSAGES = "all_assistant_messages"
    ALL_MESSAGES = "all_messages"
    """The content of every message, not the role headers."""
    ALL_TOKENS = "all_tokens"
    """Everything, role headers included."""
    ALL_USER_AND_SYSTEM_MESSAGES = "all_user_and_system_messages"
    CUSTOMIZED = "customized"
    """Each message's ``trainable`` field decides."""


class ParseTermination(StrEnum):
    """How a sampled response ended. Truthy exactly for a clean parse (``STOP_SEQUENCE`` or ``EOS``)."""

    STOP_SEQUENCE = "stop_sequence"
    """The renderer's stop sequence ended the message: the normal case."""
    EOS = "eos"
    """The model emitted its end-of-sequence token without the stop sequence (normal for base models)."""
    MALFORMED = "malformed"
    """No terminator: the response was cut off (``max_tokens``) or is otherwise not a complete message."""

    @property
    def is_clean(self) -> bool:
        return self is not ParseTermination.MALFORMED

    @property
    def is_stop_sequence(self) -> bool:
        return self is ParseTermination.STOP_SEQUENCE

    def __bool__(self) -> bool:
        return self.is_clean


# ---------------------------------------------------------------------------------------------------------
# Content helpers
# ---------------------------------------------------------------------------------------------------------


def ensure_list(content: Content) -> list[ContentPart]:
    """Content as a list of parts (a string becomes one ``TextPart``)."""
    if isinstance(content, str):
        return [TextPart(type="text", text=content)] if content else []
    return list(content)


def get_text_content(message: Message) -> str:
    """The concatenated text parts (thinking and images left out)."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")  # type: ignore[typeddict-item]


def get_thinking_content(message: Message) -> str | None:
    """The concatenated thinking parts, or None when the message has none."""
    content = message["content"]
    if isinstance(content, str):
        return None
    parts = [p["thinking"] for p in content if p["type"] == "thinking"]  # type: ignore[typeddict-item]
    return "".join(parts) if parts else None


def has_thinking(message: Message) -> bool:
    """Whether the message carries non-empty reasoning."""
    return bool(get_thinking_content(message))


def has_images(message: Message) -> bool:
    content = message["content"]
    return not isinstance(content, str) and any(p["type"] == "image" for p in content)


def remove_thinking(message: Message) -> Message:
    """A copy of ``message`` without thinking parts."""
    content = message["content"]
    if isinstance(content, str):
        return message
    return {**message, "content": [p for p in content if p["type"] != "thinking"]}  # type: ignore[typeddict-item]


def format_content_as_string(content: Content, sep: str = "\n") -> str:
    """Content as plain text for logs: thinking as ``<think>...</think>``, images as ``<image>``."""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content:
        if part["type"] == "text":
            pieces.append(part["text"])  # type: ignore[typeddict-item]
        elif part["type"] == "thinking":
            pieces.append(f"<think>{part['thinking']}</think>")  # type: ignore[typeddict-item]
        else:
            pieces.append("<image>")
    return sep.join(pieces)


def reasoned_content(thinking: str | None, text: str) -> Content:
    """A parsed reply's content: the text alone, or a thinking part then the text when the reply reasoned."""
    if thinking is None:
        return text
    return [ThinkingPart(type="thinking", thinking=thinking), TextPart(type="text", text=text)]


def assistant_message(content: Content, calls: Sequence[ToolCall] = (),
                      unparsed: Sequence[UnparsedToolCall] = ()) -> Message:
    """A parsed assistant reply, with its tool calls and the calls that could not be parsed (keys only when any)."""
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    if unparsed:
        message["unparsed_tool_calls"] = list(unparsed)
    return message


def get_tool_calls(message: Message) -> list[ToolCall]:
    """The message's tool calls as ``ToolCall`` objects (plain dicts from JSON data are accepted)."""
    calls = message.get("tool_calls") or []
    return [c if isinstance(c, ToolCall) else ToolCall.model_validate(c) for c in calls]


def get_unparsed_tool_calls(message: Message) -> list[UnparsedToolCall]:
    calls = message.get("unparsed_tool_calls") or []
    return [c if isinstance(c, UnparsedToolCall) else UnparsedToolCall.model_validate(c) for c in calls]


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


def validate_conversation(messages: Sequence[Message], what: str) -> None:
    """Raise a ``RendererError`` for an empty conversation, an unknown role, bad content, or an orphan tool message."""
    if not messages:
        raise RendererError(f"{what}: the conversation is empty; pass at least one message")
    for i, message in enumerate(messages):
        _validate_message(message, i)
    _validate_tool_messages(messages)


def _validate_message(message: Message, i: int) -> None:
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise RendererError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r:.200}")
    role = message["role"]
    if role not in KNOWN_ROLES:
        raise RendererError(f"messages[{i}]['role'] is {role!r}; expected one of {list(KNOWN_ROLES)}")
    content = message["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RendererError(
            f"messages[{i}]['content'] must be a string or a list of parts, got {type(content).__name__}"
        )
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        expected_key = {"text": "text", "thinking": "thinking", "image": "image"}.get(kind or "")
        if expected_key is None or expected_key not in part:
            raise RendererError(
                f"messages[{i}]['content'][{j}] must be a TextPart, ThinkingPart or ImagePart "
                f"(a dict with type 'text'/'thinking'/'image' and that key), got {part!r:.200}"
            )


def _validate_tool_messages(messages: Sequence[Message]) -> None:
    """Each tool message must answer a call of the closest preceding assistant message (by id when both have one)."""
    open_calls: list[ToolCall] = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            open_calls = get_tool_calls(message)
        elif message["role"] == "tool":
            if not open_calls:
                raise RendererError(
                    f"messages[{i}] is a tool result but no earlier assistant message has an unanswered tool call; "
                    "put the assistant message with the matching tool_calls before it"
                )
            call_id = message.get("tool_call_id")
            ids = [c.id for c in open_calls if c.id is not None]
            if call_id is not None and ids and call_id not in ids:
                raise RendererError(
                    f"messages[{i}]['tool_call_id'] is {call_id!r} but the preceding assistant message's "
                    f"tool calls have ids {ids}"
                )
            match = next((c for c in open_calls if call_id is not None and c.id == call_id), open_calls[0])
            open_calls = [c for c in open_calls if c is not match]
        elif message["role"] == "user":
            open_calls = []


def tool_call_from_json(raw: str) -> ToolCall | UnparsedToolCall:
    """A ``ToolCall`` from ``{"name": ..., "arguments": {...}}`` JSON text, or an ``UnparsedToolCall`` saying why not."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return UnparsedToolCall(raw_text=raw, error=f"invalid JSON: {e}")
    if not isinstance(obj, dict):
        return UnparsedToolCall(raw_text=raw, error=f"expected a JSON object, got {type(obj).__name__}")
    name, arguments = obj.get("name"), obj.get("arguments")
    if not isinstance(name, str) or not name:
        return UnparsedToolCall(raw_text=raw, error="missing or non-string 'name'")
    if not isinstance(arguments, dict):
        return UnparsedToolCall(raw_text=raw, error="missing 'arguments' object")
    return ToolCall(function=FunctionBody(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
