"""``parse_response_streaming``: deltas that add up to, and a final message equal to, ``parse_response``."""

from __future__ import annotations

import pytest

from tests.renderers.round_trip import stream, trained_tokens
from tinker_cookbook.renderers import (
    Message,
    ParseTermination,
    Renderer,
    StreamingMessageComplete,
    StreamingMessageHeader,
    StreamingTextDelta,
    StreamingThinkingDelta,
    ToolCall,
    Utf8TokenDecoder,
    get_renderer,
    get_text_content,
    get_thinking_content,
)
from tinker_cookbook.renderers.base import FunctionBody

RENDERERS = [
    ("role_colon", "llama3_tokenizer"),
    ("llama3", "llama3_tokenizer"),
    ("chatml", "smollm2_tokenizer"),
    ("qwen3", "qwen3_tokenizer"),
    ("qwen3_disable_thinking", "qwen3_tokenizer"),
    ("qwen3_instruct", "qwen3_tokenizer"),
    ("qwen3_vl", "qwen3_tokenizer"),
]

# Multi-byte characters split across tokens, inner blank lines and trailing spaces exercise the hold-backs.
TEXTS = [
    "Hello there! The answer is 42.",
    "Ünïcödé 🤖🧪𓀀🫠 漢字テスト — ok\n\nsecond paragraph   \nend",
    "Line one\nUser said: hi\n\nAssistant-like text",
]


def _response_tokens(renderer: Renderer, reply: Message) -> list[int]:
    """The tokens a model samples for ``reply``."""
    return trained_tokens(renderer, [{"role": "user", "content": "hi"}, reply])


def _check(renderer: Renderer, tokens: list[int]) -> list[object]:
    events, text, thinking = stream(renderer, tokens)
    assert events[0] == StreamingMessageHeader(role="assistant")
    final = events[-1]
    assert isinstance(final, StreamingMessageComplete)
    assert (final.message, final.termination) == renderer.parse_response(tokens)
    assert text == get_text_content(final.message)
    assert thinking == (get_thinking_content(final.message) or "")
    return events


@pytest.mark.parametrize(("name", "fixture"), RENDERERS)
@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_parse_response(name: str, fixture: str, text: str, request: pytest.FixtureRequest) -> None:
    renderer = get_renderer(name, request.getfixturevalue(fixture))
    tokens = _response_tokens(renderer, {"role": "assistant", "content": text})
    events = _check(renderer, tokens)
    assert events[-1].termination == ParseTermination.STOP_SEQUENCE  # type: ignore[attr-defined]
    # Incremental: text arrives in several deltas, not only at the end.
    assert sum(isinstance(e, StreamingTextDelta) for e in events) >= 3
    # Cut off before its stop token (max_tokens): still equal to the non-streaming parse.
    _check(renderer, tokens[: len(tokens) // 2])


def test_qwen3_streams_reasoning_then_text_and_parses_tool_calls(qwen3_tokenizer) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    call = ToolCall(function=FunctionBody(name="add", arguments='{"a": 1, "b": 2}'), id=None)
    reply: Message = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "Think 🤔 step\n\nby step"}, {"type": "text", "text": "Sum:"}],
        "tool_calls": [call],
    }
    tokens = _response_tokens(renderer, reply)
    events = _check(renderer, tokens)
    kinds = [type(e).__name__ for e in events if isinstance(e, (StreamingTextDelta, StreamingThinkingDelta))]
    assert kinds.index("StreamingTextDelta") > kinds.index("StreamingThinkingDelta")
    assert "StreamingThinkingDelta" not in kinds[kinds.index("StreamingTextDelta") :]  # reasoning first, then text
    final = events[-1]
    assert final.message["tool_calls"][0].function.name == "add"  # type: ignore[attr-defined]
    # No tool-call markup leaks into the streamed text.
    assert all("<tool_call>" not in e.text for e in events if isinstance(e, StreamingTextDelta))


def test_streaming_stops_reading_at_the_stop_token(smollm2_tokenizer) -> None:
    renderer = get_renderer("chatml", smollm2_tokenizer)
    tokens = _response_tokens(renderer, {"role": "assistant", "content": "short"})
    rest = iter([5, 6, 7])
    source = iter([*tokens, *rest])
    events = list(renderer.parse_response_streaming(source))
    assert events[-1] == StreamingMessageComplete(*renderer.parse_response(tokens))
    assert list(source) == [5, 6, 7]


def test_role_colon_never_streams_the_stop_string(llama3_tokenizer) -> None:
    renderer = get_renderer("role_colon", llama3_tokenizer)
    tokens = _response_tokens(renderer, {"role": "assistant", "content": "Fine, thanks."})
    _, text, _ = stream(renderer, tokens)
    assert text == "Fine, thanks."


def test_utf8_decoder_holds_incomplete_characters(qwen3_tokenizer) -> None:
    text = "a🤖b漢字 c𓀀🦩 d"
    ids = qwen3_tokenizer.encode(text, add_special_tokens=False)
    decoder = Utf8TokenDecoder(lambda t: qwen3_tokenizer.decode(t))
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > len([p for p in pieces if p])  # some token completed no character on its own
