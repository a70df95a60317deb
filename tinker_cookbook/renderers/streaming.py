"""Streaming response parsing, for servers and UIs that show a reply while it is being sampled.

``renderer.parse_response_streaming(tokens)`` reads sampled tokens one at a time (any iterable, e.g. a generator
fed by the sampler) and yields:

- ``StreamingMessageHeader(role="assistant")`` first;
- ``StreamingThinkingDelta(thinking=...)`` / ``StreamingTextDelta(text=...)`` as reasoning and visible text grow;
- ``StreamingMessageComplete(message, termination)`` last, where ``(message, termination)`` is exactly
  ``renderer.parse_response(tokens up to and including the stop token)``.

The deltas of each kind concatenate to the final message's reasoning and text. A delta is emitted only once it can
no longer change: incomplete UTF-8 characters, trailing whitespace (the parse strips it at the end of a field) and
a partial string stop sequence (role_colon's ``"\\n\\nUser:"``) are held back until the next token settles them.
Tool calls are not streamed as text: they arrive parsed in the final message. Tokens after the stop token are not
read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from tinker_cookbook.renderers.messages import Message, ParseTermination, Role

if TYPE_CHECKING:
    from tinker_cookbook.renderers.base import Renderer


@dataclass(frozen=True)
class StreamingMessageHeader:
    role: Role


@dataclass(frozen=True)
class StreamingTextDelta:
    text: str


@dataclass(frozen=True)
class StreamingThinkingDelta:
    thinking: str


@dataclass(frozen=True)
class StreamingMessageComplete:
    message: Message
    termination: ParseTermination


MessageDelta: TypeAlias = StreamingMessageHeader | StreamingTextDelta | StreamingThinkingDelta | StreamingMessageComplete


class Utf8TokenDecoder:
    """Incremental detokenization: ``push(token)`` returns the text that token completes.

    Decodes a window of the last few tokens, not the whole list, so each token costs O(1). The window starts one
    emitted token back, so that tokenizers which drop a leading space at the start of a decode still diff
    correctly; text ending in an incomplete character (U+FFFD) waits for the next token.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._tokens: list[int] = []
        self._window_start = 0  # first token of the decoded window
        self._emitted_end = 0  # tokens before this index have had their text returned
        self._emitted_text = ""  # decode(tokens[window_start:emitted_end])

    def push(self, token: int) -> str:
        self._tokens.append(int(token))
        text = self._decode(self._tokens[self._window_start :])
        if text.endswith("\ufffd") or not text.startswith(self._emitted_text):
            return ""
        delta = text[len(self._emitted_text) :]
        self._window_start, self._emitted_end = self._emitted_end, len(self._tokens)
        self._emitted_text = self._decode(self._tokens[self._window_start : self._emitted_end])
        return delta


def _held_back(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` without what may still change: trailing whitespace, and a tail that could start a stop string."""
    stable = text.rstrip()
    for stop in stop_strings:
        for n in range(min(len(stop), len(stable)), 0, -1):
            if stable.endswith(stop[:n]):
                stable = stable[:-n].rstrip()
                break
    return stable


def parse_streaming(renderer: Renderer, tokens: Iterable[int]) -> Iterator[MessageDelta]:
    """The implementation of ``Renderer.parse_response_streaming`` (see the module docstring)."""
    stop_sequences = renderer.get_stop_sequences()
    stop_ids = {s for s in stop_sequences if isinstance(s, int)}
    stop_strings = [s for s in stop_sequences if isinstance(s, str)]
    end_ids = stop_ids | set(renderer.end_of_sequence_ids())
    decoder = Utf8TokenDecoder(renderer.decode)
    consumed: list[int] = []
    body = ""  # decoded text of the tokens before any stop or end token
    emitted = {"thinking": "", "text": ""}

    def deltas(thinking: str, text: str) -> Iterator[MessageDelta]:
        for kind, value in (("thinking", thinking), ("text", text)):
            if len(value) > len(emitted[kind]) and value.startswith(emitted[kind]):
                new = value[len(emitted[kind]) :]
                emitted[kind] = value
                yield StreamingThinkingDelta(new) if kind == "thinking" else StreamingTextDelta(new)

    yield StreamingMessageHeader(role="assistant")
    for token in tokens:
        consumed.append(int(token))
        if int(token) in end_ids:
            break
        body += decoder.push(token)
        if any(stop in body for stop in stop_strings):
            break
        thinking, text = renderer.streaming_fields(body)
        yield from deltas(_held_back(thinking, []), _held_back(text, stop_strings))
    message, termination = renderer.parse_response(consumed)
    from tinker_cookbook.renderers.messages import get_text_content, get_thinking_content

    yield from deltas(get_thinking_content(message) or "", get_text_content(message))
    yield StreamingMessageComplete(message, termination)
