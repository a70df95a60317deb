"""What both OpenAI sampling routes share: one ``backend.sample`` call, the choices they answer with (``Choice``,
with its tool calls), token pieces, usage and Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tinker_cookbook.server.openai_models import ServedModel
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.backend import Backend


async def sample(backend: Backend[Any], served: ServedModel, prompt: types.ModelInput, n: int,
                 params: types.SamplingParams) -> types.SampleResponse:
    future = backend.sample(served.handle, prompt, n, params, False, 0)  # validation errors raise here
    # If the client goes away, cancelling this await cancels the request; the sampler skips cancelled futures.
    return await asyncio.wrap_future(future)


def token_pieces(tokenizer: Any, tokens: Sequence[int]) -> list[str]:
    return [str(tokenizer.decode([t], skip_special_tokens=False)) for t in tokens]


def tokens_within(pieces: list[str], length: int) -> int:
    """How many leading tokens (by their decoded pieces) start inside the first ``length`` characters."""
    count, offset = 0, 0
    for piece in pieces:
        if offset >= length:
            break
        offset += len(piece)
        count += 1
    return count


@dataclass
class ToolCallOut:
    id: str
    name: str
    arguments: str

    def as_json(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass
class Choice:
    index: int
    text: str
    finish_reason: str
    tokens: list[int]
    """The sampled tokens the text comes from (for logprobs)."""
    logprobs: list[float]
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] = field(default_factory=list)


def token_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


_PIECES = re.compile(r"\S+\s*|\s+")


def stream_pieces(text: str) -> list[str]:
    """The text in word-sized pieces for streaming (their concatenation is the text)."""
    return _PIECES.findall(text)


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
