"""Tools as typed Python functions: ``@tool`` reads the signature and docstring into a JSON schema.

    @tool
    def search(query: str, k: int = 1) -> str:
        '''Search the encyclopedia.

        Args:
            query: Words to look for.
            k: How many articles to return.
        '''

``search.spec()`` is the ``ToolSpec`` a renderer declares to the model (name, the docstring's first paragraph,
and ``{"type": "object", "properties": ..., "required": [...]}`` from the annotations and defaults, each property
described by its ``Args:`` line). ``search.check_arguments(args)`` lists what is wrong with a call's arguments, one
line per problem. The function may be sync or async and returns the result text (anything else is sent as JSON).
Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict``, ``Literal[...]`` and
``X | None``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, overload

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.renderers import ToolSpec

_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, description, JSON schema of arguments and the function itself."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout_s: float | None = None
    """A call that takes longer is answered with a timeout error (None: no limit)."""

    def spec(self) -> ToolSpec:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def check_arguments(self, arguments: Any) -> list[str]:
        """Every problem with ``arguments`` against the schema, one line each (empty when they are valid)."""
        if not isinstance(arguments, dict):
            return [f"arguments must be a JSON object, got {_json_type(arguments)}"]
        properties: dict[str, Any] = self.parameters["properties"]
        problems = [
            f"unknown argument {key!r}; {self.name} takes {sorted(properties) or 'no arguments'}"
            for key in arguments if key not in properties
        ]
        problems += [f"missing required argument {key!r}" for key in self.parameters["required"] if key not in arguments]
        for key, value in arguments.items():
            if key in properties:
                problems += [f"argument {key!r} {p}" for p in _check_value(value, properties[key])]
        return problems

    async def run(self, arguments: dict[str, Any]) -> str:
        """Call the function with already checked ``arguments``; its result as text."""
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**arguments)
        else:
            # In a thread, so that a slow sync tool does not block the other rollouts (after a timeout the thread
            # runs on and its result is dropped: Python cannot stop a thread).
            result = await asyncio.to_thread(self.fn, **arguments)
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(*, name: str | None = None, timeout_s: float | None = None) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, timeout_s: float | None = None
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a ``Tool`` of a typed function (``@tool`` or ``@tool(name=..., timeout_s=...)``)."""

    def build(f: Callable[..., Any]) -> Tool:
        summary, arg_docs = parse_docstring(inspect.getdoc(f) or "")
        return Tool(name=name or f.__name__, description=summary, parameters=function_schema(f, arg_docs),
                    fn=f, timeout_s=timeout_s)

    return build(fn) if fn is not None else build


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the first paragraph, ``{argument: description}`` from a Google-style ``Args:`` section)."""
    summary = doc.split("\n\n", 1)[0].strip().replace("\n", " ")
    arg_docs: dict[str, str] = {}
    in_args, current, arg_indent = False, "", -1
    for line in doc.splitlines():
        if _ARGS_HEADER.match(line):
            in_args, current, arg_indent = True, "", -1
            continue
        if not in_args:
            continue
        if not line.strip() or not line[0].isspace():  # a blank line or the next section ends ``Args:``
            in_args = not arg_docs and not line.strip()
            continue
        indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line)
        if match and (arg_indent < 0 or indent <= arg_indent):
            arg_indent, current = indent, match.group(1)
            arg_docs[current] = match.group(2).strip()
        elif current:  # a continuation line of the current argument
            arg_docs[current] = f"{arg_docs[current]} {line.strip()}".strip()
    return summary, arg_docs


def function_schema(fn: Callable[..., Any], arg_docs: dict[str, str]) -> dict[str, Any]:
    """The JSON schema of ``fn``'s arguments; a ConfigurationError naming a parameter that cannot be described."""
    hints = get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"tool {fn.__name__}: parameter {param.name!r} is *args/**kwargs/positional-only; a tool takes "
                "named arguments only"
            )
        if param.name not in hints:
            raise ConfigurationError(
                f"tool {fn.__name__}: parameter {param.name!r} has no type annotation; annotate it (e.g. str)"
            )
        schema = type_schema(hints[param.name], f"{fn.__name__}.{param.name}")
        if param.name in arg_docs:
            schema["description"] = arg_docs[param.name]
        properties[param.name] = schema
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


def type_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one annotation (see the module docstring for the supported ones)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0], where) if args else {}}
    if origin is dict:
        return {"type": "object"}
    if origin is Literal:
        return {"type": _JSON_TYPES.get(type(args[0]), "string"), "enum": list(args)}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return type_schema(rest[0], where)  # Optional: null is accepted by leaving the argument out
    raise ConfigurationError(
        f"tool parameter {where} has annotation {annotation!r}, which has no JSON schema here; use str, int, "
        "float, bool, list[...], dict, Literal[...] or X | None"
    )


def _check_value(value: Any, schema: dict[str, Any]) -> list[str]:
    if "enum" in schema and value not in schema["enum"]:
        return [f"must be one of {schema['enum']}, got {value!r}"]
    expected = str(schema.get("type", ""))
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }.get(expected, True)
    if not ok:
        return [f"must be {'an' if expected in ('integer', 'object', 'array') else 'a'} {expected}, "
                f"got {_json_type(value)} {json.dumps(value, default=str)[:60]}"]
    if expected == "array" and schema.get("items"):
        return [f"item {i} {p}" for i, item in enumerate(value) for p in _check_value(item, schema["items"])]
    return []


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for py_type, name in (
        (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object")
    ):
        if isinstance(value, py_type):
            return name
    return type(value).__name__
