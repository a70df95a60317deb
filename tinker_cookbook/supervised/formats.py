"""Rows of supervised data in the shapes people have, turned into conversations (``messages``).

Four row shapes are recognised, by their keys:

- ``messages``: ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (OpenAI / TRL conversational);
- ``sharegpt``: ``{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}``
  (``from`` is ``system``, ``human``/``user``, ``gpt``/``assistant``/``chatgpt``/``bing``, ``tool``/
  ``function_response``; ``role``/``content`` items are accepted too; an optional top-level ``system``);
- ``alpaca``: ``{"instruction": "...", "input": "...", "output": "..."}`` (``input`` optional, joined to the
  instruction by a blank line; an optional ``system``);
- ``prompt_completion``: ``{"prompt": "...", "completion": "..."}`` (TRL's standard form; either side may also be
  a list of messages, TRL's conversational prompt-completion form).

``detect_format(row)`` names a row's shape; ``row_to_messages(row, fmt)`` converts one row. ``columns`` renames a
dataset's own columns to these keys first (``{"prompt": "question", "completion": "answer"}`` reads the
``question`` column as the prompt). A row of no known shape raises ``DataFormatError`` naming its keys and the
shapes expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, get_args

from tinker_cookbook.exceptions import DataFormatError

RowFormat: TypeAlias = Literal["auto", "messages", "sharegpt", "alpaca", "prompt_completion"]
ROW_FORMATS: tuple[str, ...] = get_args(RowFormat)
ROLES = ("system", "user", "assistant", "tool")

SHAREGPT_ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bing": "assistant", "model": "assistant", "tool": "tool",
    "function_response": "tool", "observation": "tool",
}
EXPECTED_SHAPES = (
    'messages: {"messages": [{"role": ..., "content": ...}, ...]}; '
    'ShareGPT: {"conversations": [{"from": "human"|"gpt"|..., "value": ...}, ...]}; '
    'Alpaca: {"instruction": ..., "input": (optional), "output": ...}; '
    'prompt/completion: {"prompt": ..., "completion": ...}'
)
# The keys that identify each shape, in the order they are tried.
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("messages", ("messages",)),
    ("sharegpt", ("conversations",)),
    ("alpaca", ("instruction", "output")),
    ("prompt_completion", ("prompt", "completion")),
)


def rename_columns(row: Mapping[str, Any], columns: Mapping[str, str] | None) -> dict[str, Any]:
    """``row`` with its columns renamed to the expected keys: ``columns`` maps an expected key to the row's column."""
    out = dict(row)
    for key, column in (columns or {}).items():
        if column not in row:
            raise DataFormatError(f"columns.{key}={column!r}: the row has no column {column!r} (its columns: "
                                  f"{sorted(row)})")
        out[key] = row[column]
    return out


def detect_format(row: Any) -> str:
    """The shape of ``row`` (``messages``, ``sharegpt``, ``alpaca`` or ``prompt_completion``)."""
    if not isinstance(row, Mapping):
        raise DataFormatError(f"expected an object (a JSON object / a dataset row), got {type(row).__name__}; "
                              f"expected shapes: {EXPECTED_SHAPES}")
    for name, keys in _SIGNATURES:
        if all(key in row for key in keys):
            return name
    raise DataFormatError(f"a row with keys {sorted(row)} has none of the known shapes ({EXPECTED_SHAPES}); "
                          "read other columns as these keys with columns.<key>=<column>, e.g. columns.prompt=question "
                          "columns.completion=answer")


def row_to_messages(row: Any, fmt: str = "auto", columns: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The conversation of one row in format ``fmt`` (``auto``: detected from its keys); raises ``DataFormatError``."""
    if fmt not in ROW_FORMATS:
        raise DataFormatError(f"format={fmt!r} must be one of {list(ROW_FORMATS)}")
    if not isinstance(row, Mapping):
        detect_format(row)  # raises, naming the shapes
    row = rename_columns(row, columns)
    shape = detect_format(row) if fmt == "auto" else fmt
    keys = dict(_SIGNATURES)[shape]
    missing = [key for key in keys if key not in row]
    if missing:
        raise DataFormatError(f"format={shape} needs keys {list(keys)}; this row has {sorted(row)} "
                              f"(missing {missing})")
    messages = _CONVERTERS[shape](row)
    return check_messages(messages)


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` checked to be a non-empty list of ``{"role": one of ROLES, "content": str | list}``."""
    if not isinstance(messages, list) or not messages:
        raise DataFormatError(f"expected a non-empty list of messages, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise DataFormatError(f"messages[{i}] is a {type(message).__name__}, not an object with role/content")
        if message.get("role") not in ROLES:
            raise DataFormatError(f"messages[{i}].role={message.get('role')!r} is not one of {list(ROLES)}")
        if not isinstance(message.get("content"), (str, list)):
            raise DataFormatError(f"messages[{i}].content must be a string or a list of parts")
    return [dict(message) for message in messages]


def _text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataFormatError(f"{key!r} must be a string, got {type(value).__name__}")
    return value


def _system(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    system = _text(row, "system")
    return [{"role": "system", "content": system}] if system else []


def _from_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(row["messages"]) if isinstance(row["messages"], list) else row["messages"]


def _from_sharegpt(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    turns = row["conversations"]
    if not isinstance(turns, list):
        raise DataFormatError(f"'conversations' must be a list of turns, got {type(turns).__name__}")
    messages = _system(row)
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise DataFormatError(f"conversations[{i}] is a {type(turn).__name__}, not an object with from/value")
        if "from" in turn:
            speaker = str(turn["from"]).lower()
            if speaker not in SHAREGPT_ROLES:
                raise DataFormatError(f"conversations[{i}].from={turn['from']!r} is not one of "
                                      f"{sorted(SHAREGPT_ROLES)}")
            messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn.get("value")})
        else:
            messages.append(dict(turn))
    return messages


def _from_alpaca(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    instruction, extra = _text(row, "instruction"), _text(row, "input")
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    return [*_system(row), {"role": "user", "content": prompt}, {"role": "assistant", "content": _text(row, "output")}]


def _side(value: Any, role: str, key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return list(value)
    raise DataFormatError(f"{key!r} must be a string or a list of messages, got {type(value).__name__}")


def _from_prompt_completion(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*_system(row), *_side(row["prompt"], "user", "prompt"),
            *_side(row["completion"], "assistant", "completion")]


_CONVERTERS = {
    "messages": _from_messages,
    "sharegpt": _from_sharegpt,
    "alpaca": _from_alpaca,
    "prompt_completion": _from_prompt_completion,
}
