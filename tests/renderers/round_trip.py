"""What the renderer round-trip tests share: the tokens a model samples for a reply, and a streamed parse of them."""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook.renderers import Message, Renderer, StreamingTextDelta, StreamingThinkingDelta


def trained_tokens(renderer: Renderer, messages: Sequence[Message]) -> list[int]:
    """The trained part of a supervised example of ``messages``: what a model samples for the last reply."""
    model_input, weights = renderer.build_supervised_example(list(messages))
    return [t for t, w in zip(model_input.to_ints(), weights.tolist(), strict=True) if w > 0]


def stream(renderer: Renderer, tokens: Sequence[int]) -> tuple[list[object], str, str]:
    """The streaming parse of ``tokens``: its events, the visible text and the reasoning they carry."""
    events: list[object] = list(renderer.parse_response_streaming(iter(tokens)))
    text = "".join(e.text for e in events if isinstance(e, StreamingTextDelta))
    thinking = "".join(e.thinking for e in events if isinstance(e, StreamingThinkingDelta))
    return events, text, thinking
