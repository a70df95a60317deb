"""Running a model's tool calls: ``ToolRegistry`` looks the tool up, checks the arguments and calls it.

Nothing a call does raises: an unknown tool, arguments that are not a JSON object or do not match the schema, an
exception inside the tool and a timeout each come back as a ``tool`` message that says what went wrong (so the model
can read it and try again), with ``ToolCallOutcome.error`` saying which of these it was.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.renderers import Message, ToolCall, ToolSpec
from tinker_cookbook.tool_use.tools import Tool


class ToolCallError(StrEnum):
    """Why a call produced no result. The first two are the model's mistakes (format errors), the others the tool's."""

    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"
    EXCEPTION = "exception"
    TIMEOUT = "timeout"

    @property
    def is_format_error(self) -> bool:
        return self in (ToolCallError.UNKNOWN_TOOL, ToolCallError.BAD_ARGUMENTS)


@dataclass(frozen=True)
class ToolCallOutcome:
    """The ``tool`` message that answers a call, and the error kind when it failed."""

    message: Message
    error: ToolCallError | None = None


class ToolRegistry:
    """The tools an agent may call, by name."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ConfigurationError(f"two tools are named {t.name!r}; tool names must be unique")
            self.tools[t.name] = t

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self.tools.values()]

    async def call(self, call: ToolCall) -> ToolCallOutcome:
        """Run ``call`` (see the module docstring); never raises for anything the call or the tool does."""
        name = call.function.name
        t = self.tools.get(name)
        if t is None:
            return _failure(call, ToolCallError.UNKNOWN_TOOL,
                            f"unknown tool {name!r}; the tools are {sorted(self.tools) or 'none'}")
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError as e:
            return _failure(call, ToolCallError.BAD_ARGUMENTS, f"arguments are not valid JSON: {e}")
        problems = t.check_arguments(arguments)
        if problems:
            return _failure(call, ToolCallError.BAD_ARGUMENTS, f"bad arguments for {name}:\n" + "\n".join(problems))
        try:
            result = await asyncio.wait_for(t.run(arguments), timeout=t.timeout_s)
        except TimeoutError:
            return _failure(call, ToolCallError.TIMEOUT, f"{name} took longer than {t.timeout_s} s and was stopped")
        except Exception as e:  # the tool's own failure is reported to the model, not raised into the rollout
            return _failure(call, ToolCallError.EXCEPTION, f"{name} failed: {type(e).__name__}: {e}")
        return ToolCallOutcome(tool_message(call, result))


def tool_message(call: ToolCall, content: str) -> Message:
    """The ``tool`` message answering ``call``."""
    message: Message = {"role": "tool", "content": content, "name": call.function.name}
    if call.id is not None:
        message["tool_call_id"] = call.id
    return message


def _failure(call: ToolCall, error: ToolCallError, text: str) -> ToolCallOutcome:
    return ToolCallOutcome(tool_message(call, f"Error: {text}"), error)
