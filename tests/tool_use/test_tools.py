"""``@tool`` schemas and argument checks, and ``ToolRegistry``'s answers to good and bad calls."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import pytest

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.renderers import FunctionBody, ToolCall
from tinker_cookbook.tool_use import ToolCallError, ToolRegistry, tool


@tool
def lookup(query: str, k: int = 1, mode: Literal["fast", "exact"] = "fast", tags: list[str] | None = None,
           weight: float = 1.0) -> str:
    """Look something up in the notes.

    More text that is not part of the description.

    Args:
        query: Words to look for,
            over two lines.
        k: How many notes.
        mode: Which matcher.

    Returns:
        The notes.
    """
    return f"{query}|{k}|{mode}|{tags}|{weight}"


@tool(name="add", timeout_s=5)
async def add_numbers(a: int, b: int) -> dict:
    """Add two integers."""
    return {"sum": a + b}


@tool(timeout_s=0.01)
async def slow() -> str:
    """Never finishes in time."""
    await asyncio.sleep(30)
    return "late"


@tool
def broken(x: int) -> str:
    """Always fails."""
    raise KeyError(f"no note {x}")


def _call(name: str, arguments: object, call_id: str | None = "c1") -> ToolCall:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(function=FunctionBody(name=name, arguments=raw), id=call_id)


def test_schema_from_signature_and_docstring() -> None:
    assert lookup.spec() == {
        "name": "lookup",
        "description": "Look something up in the notes.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to look for, over two lines."},
                "k": {"type": "integer", "description": "How many notes."},
                "mode": {"type": "string", "enum": ["fast", "exact"], "description": "Which matcher."},
                "tags": {"type": "array", "items": {"type": "string"}},
                "weight": {"type": "number"},
            },
            "required": ["query"],
        },
    }
    assert add_numbers.name == "add" and add_numbers.timeout_s == 5


def test_argument_problems_one_line_each() -> None:
    assert lookup.check_arguments({"query": "x", "k": 2, "weight": 3, "tags": ["a"]}) == []
    problems = lookup.check_arguments({"k": "two", "mode": "slow", "tags": ["a", 1], "limit": 3, "weight": True})
    assert problems == [
        "unknown argument 'limit'; lookup takes ['k', 'mode', 'query', 'tags', 'weight']",
        "missing required argument 'query'",
        "argument 'k' must be an integer, got string \"two\"",
        "argument 'mode' must be one of ['fast', 'exact'], got 'slow'",
        "argument 'tags' item 1 must be a string, got integer 1",
        "argument 'weight' must be a number, got boolean true",
    ]
    assert lookup.check_arguments(["x"]) == ["arguments must be a JSON object, got array"]


def test_functions_that_cannot_be_tools() -> None:
    def untyped(x) -> str:  # type: ignore[no-untyped-def]
        return ""

    def bad_type(x: set[int]) -> str:
        return ""

    with pytest.raises(ConfigurationError, match="parameter 'x' has no type annotation"):
        tool(untyped)
    with pytest.raises(ConfigurationError, match=r"bad_type.x has annotation set\[int\]"):
        tool(bad_type)
    with pytest.raises(ConfigurationError, match="two tools are named 'lookup'"):
        ToolRegistry([lookup, lookup])


def test_registry_runs_good_calls() -> None:
    registry = ToolRegistry([lookup, add_numbers])
    outcome = asyncio.run(registry.call(_call("lookup", {"query": "owls", "k": 2})))
    assert outcome.error is None
    assert outcome.message == {"role": "tool", "content": "owls|2|fast|None|1.0", "name": "lookup",
                               "tool_call_id": "c1"}
    outcome = asyncio.run(registry.call(_call("add", {"a": 2, "b": 3}, call_id=None)))
    assert outcome.message == {"role": "tool", "content": '{"sum": 5}', "name": "add"}


@pytest.mark.parametrize(("name", "arguments", "error", "text"), [
    ("search", {"query": "x"}, ToolCallError.UNKNOWN_TOOL,
     "Error: unknown tool 'search'; the tools are ['broken', 'lookup', 'slow']"),
    ("lookup", "{not json", ToolCallError.BAD_ARGUMENTS, "Error: arguments are not valid JSON: Expecting"),
    ("lookup", {"k": 1}, ToolCallError.BAD_ARGUMENTS,
     "Error: bad arguments for lookup:\nmissing required argument 'query'"),
    ("broken", {"x": 3}, ToolCallError.EXCEPTION, "Error: broken failed: KeyError: 'no note 3'"),
    ("slow", {}, ToolCallError.TIMEOUT, "Error: slow took longer than 0.01 s and was stopped"),
])
def test_registry_answers_bad_calls_with_an_error_message(name: str, arguments: object, error: ToolCallError,
                                                          text: str) -> None:
    registry = ToolRegistry([lookup, broken, slow])
    outcome = asyncio.run(registry.call(_call(name, arguments)))
    assert outcome.error is error
    assert outcome.message["role"] == "tool" and str(outcome.message["content"]).startswith(text)
    assert outcome.error.is_format_error == (error in (ToolCallError.UNKNOWN_TOOL, ToolCallError.BAD_ARGUMENTS))
