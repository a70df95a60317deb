"""Seeded random conversations for renderer-vs-chat-template comparisons.

Content mixes words, digits, punctuation, non-ASCII text, inner newlines and code, but never starts with a
newline: renderers tokenize the role header and the content separately (so prompts are exact prefixes of
longer conversations), and only a leading newline could merge across that boundary.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from tinker_cookbook.renderers import Message, ToolCall, ToolSpec
from tinker_cookbook.renderers.base import FunctionBody

WORDS = [
    "hello", "world", "The", "quick", "brown", "fox", "jumps", "42", "3.14", "naïve", "café", "日本語", "🎉",
    "don't", "(x)", "a,b", "$100", "end.", "?", "!", "-", "ünïcödé", "<b>bold</b>", "x^2", "√2", "{json}",
    "def", "f():", "return", "C++", "e.g.", "100%", "@user", "#tag", "tab\there",
]  # fmt: skip
SEPARATORS = [" ", " ", " ", " ", "\n", ", ", "\n\n", ". ", "  "]
TOOL_NAMES = ["get_weather", "search", "calculator", "lookup_user"]


def random_text(rng: random.Random, min_words: int = 1, max_words: int = 14) -> str:
    n = rng.randint(min_words, max_words)
    words = [rng.choice(WORDS) for _ in range(n)]
    text = words[0]
    for word in words[1:]:
        text += rng.choice(SEPARATORS) + word
    if rng.random() < 0.1:
        text = " " + text
    if rng.random() < 0.1:
        text += "\n"
    if rng.random() < 0.1:
        text += "\n```python\nprint('hi')\n```"
    return text


def random_tools(rng: random.Random) -> list[ToolSpec]:
    names = rng.sample(TOOL_NAMES, rng.randint(1, 3))
    return [
        {
            "name": name,
            "description": random_text(rng, 2, 8),
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look up"}},
                "required": ["query"],
            },
        }
        for name in names
    ]


def random_tool_call(rng: random.Random, tools: list[ToolSpec], idx: int) -> ToolCall:
    args: dict[str, Any] = {"query": random_text(rng, 1, 4)}
    if rng.random() < 0.3:
        args["limit"] = rng.randint(1, 10)
    name = rng.choice(tools)["name"]
    return ToolCall(
        id=f"call_{idx}", function=FunctionBody(name=name, arguments=json.dumps(args, ensure_ascii=False))
    )


@dataclass
class Conversation:
    system_prompt: str | None
    tools: list[ToolSpec] | None
    messages: list[Message] = field(default_factory=list)
    """The conversation after the system prompt / tool declarations."""


def _assistant(rng: random.Random, thinking_p: float, calls: list[ToolCall] | None = None) -> Message:
    text = "" if (calls and rng.random() < 0.4) else random_text(rng)
    message: Message
    if rng.random() < thinking_p:
        reasoning = random_text(rng, 3, 20)
        if rng.random() < 0.25:  # the older string form with inline tags, which the template also reads
            message = {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n\n{text}"}
        else:
            message = {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": reasoning}, {"type": "text", "text": text}],
            }
    else:
        message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def random_conversation(
    rng: random.Random, *, with_tools: bool = True, thinking_p: float = 0.5, system_p: float = 0.5
) -> Conversation:
    """User/assistant turns, with tool-call rounds (calls, then one tool result per call) when ``with_tools``."""
    tools = random_tools(rng) if with_tools and rng.random() < 0.6 else None
    system = random_text(rng, 3, 12) if rng.random() < system_p else None
    conv = Conversation(system_prompt=system, tools=tools)
    call_idx = 0
    for _ in range(rng.randint(1, 4)):
        conv.messages.append({"role": "user", "content": random_text(rng)})
        for _ in range(rng.randint(0, 2) if tools else 0):
            calls = [random_tool_call(rng, tools, call_idx + k) for k in range(rng.randint(1, 2))]  # type: ignore[arg-type]
            call_idx += len(calls)
            conv.messages.append(_assistant(rng, thinking_p, calls))
            for call in calls:
                conv.messages.append(
                    {"role": "tool", "content": random_text(rng, 1, 8), "tool_call_id": call.id}
                )  # type: ignore[typeddict-item]
        conv.messages.append(_assistant(rng, thinking_p))
    return conv
