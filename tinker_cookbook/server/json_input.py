"""Reading a JSON request body safely: the one parser every JSON route goes through before its schema.

``read_json(raw)`` answers every body a hostile client can send with ``BadRequestError`` (a 400) naming the place
in the body, never with a crash deeper down:

- bodies nested deeper than ``MAX_JSON_DEPTH`` (Python's decoder would hit its recursion limit);
- integers outside the signed 64-bit range, which torch, numpy and C extensions cannot hold (``top_k=2**64``
  overflowed inside the sampler, and ``ttl_seconds=10**30`` inside ``datetime``);
- strings holding lone UTF-16 surrogates (``"\\ud800"`` is valid JSON but no valid text: tokenizers and UTF-8
  encoders refuse it).
"""

from __future__ import annotations

import json
from typing import Any

from tinker_cookbook.tinker.errors import BadRequestError

MAX_JSON_DEPTH = 64
"""Nesting levels a body may have; every route's schema needs fewer than 10."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def read_json(raw: bytes) -> Any:
    """The parsed body; BadRequestError for malformed JSON and for the values above (naming where they are)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise BadRequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels; send a flatter "
                              "JSON object") from None
    except ValueError as exc:  # also UnicodeDecodeError, and integers of more than 4300 digits
        raise BadRequestError(f"the request body is not valid JSON ({exc}); send a JSON object") from None
    check_json_values(data)
    return data


def check_json_values(data: Any) -> None:
    """Walk ``data`` (iteratively: depth is what is being checked) and refuse what no route can use."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequestError(f"{where or 'the body'}: nested deeper than {MAX_JSON_DEPTH} levels; send a "
                                  "flatter JSON object")
        if isinstance(value, dict):
            items: Any = value.items()
            for key, _ in value.items():
                _check_text(key, where or "the body", "a key")
        elif isinstance(value, list):
            if _plain_ints(value):
                continue
            items = enumerate(value)
        else:
            _check_scalar(value, where or "the body")
            continue
        for key, item in items:
            if isinstance(item, dict | list):
                stack.append((item, _path(where, key), depth + 1))
            elif not _scalar_ok(item):  # scalars are checked in place: a prompt may hold a million token ids
                _check_scalar(item, _path(where, key))


def _plain_ints(values: list[Any]) -> bool:
    """Whether ``values`` are all integers in range, checked at C speed (token id lists are long)."""
    if not all(type(v) is int for v in values):
        return False
    return not values or (INT64_MIN <= min(values) and max(values) <= INT64_MAX)


def _path(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _scalar_ok(value: Any) -> bool:
    if isinstance(value, str):
        return value.isascii()
    return not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX


def _check_scalar(value: Any, where: str) -> None:
    if isinstance(value, str):
        _check_text(value, where, "the string")
    elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        shown = str(value) if len(str(value)) <= 40 else f"a {len(str(value))}-digit integer"
        raise BadRequestError(f"{where}: {shown} is outside the signed 64-bit integer range [-2**63, 2**63 - 1] "
                              "that this server accepts; send a smaller value")


def _check_text(text: str, where: str, what: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequestError(
            f"{where}: {what} holds a lone UTF-16 surrogate ({text[exc.start]!r} at character {exc.start}), which "
            "is not valid Unicode text; escape non-BMP characters as surrogate pairs or send them as UTF-8"
        ) from None
