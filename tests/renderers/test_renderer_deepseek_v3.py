"""DeepSeek-V3.1's format (deepseekv3, deepseekv3_thinking), checked as text against hand-written strings of the
model's published template. No DeepSeek tokenizer ships offline: the tokenizer here is Qwen3's with DeepSeek's
special tokens added (``deepseek_tokenizer``)."""

from __future__ import annotations

import pytest

from tests.renderers.round_trip import stream, trained_tokens
from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers import (
    DeepSeekV3Renderer,
    Message,
    ParseTermination,
    StreamingMessageComplete,
    ToolCall,
    get_renderer,
)
from tinker_cookbook.renderers.base import FunctionBody
from tinker_cookbook.tokenizer_utils import Tokenizer

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
REASONED: list[Message] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "Add them."}, {"type": "text", "text": "4"}]},
]
TWO_TURNS: list[Message] = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "A greeting."}, {"type": "text",
                                                                                        "text": "Hello"}]},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Bye!"},
]
CALL = ToolCall(id="c1", function=FunctionBody(name="add", arguments='{"a": 1, "b": 2}'))
TOOLS: list[Message] = [
    {"role": "user", "content": "Add 1 and 2"},
    {"role": "assistant", "content": "Calling.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "3"},
    {"role": "assistant", "content": "It is 3."},
]


def _text(tokenizer: Tokenizer, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def _example(tokenizer: Tokenizer, name: str, messages: list[Message]) -> tuple[str, str, str]:
    """The whole example, its trained part, and the generation prompt before its last message."""
    renderer = get_renderer(name, tokenizer)
    model_input, weights = renderer.build_supervised_example(messages)
    ids = model_input.to_ints()
    trained = [t for t, w in zip(ids, weights.tolist(), strict=True) if w]
    prompt = renderer.build_generation_prompt(messages[:-1]).to_ints()
    return _text(tokenizer, ids), _text(tokenizer, trained), _text(tokenizer, prompt)


def test_non_thinking_mode_opens_every_reply_with_think_close(deepseek_tokenizer: Tokenizer) -> None:
    whole, trained, prompt = _example(deepseek_tokenizer, "deepseekv3", TWO_TURNS)
    assert whole == (f"{BOS}<｜User｜>Hi<｜Assistant｜></think>Hello{EOS}"
                     f"<｜User｜>Bye<｜Assistant｜></think>Bye!{EOS}")
    assert trained == f"Bye!{EOS}" and whole == prompt + trained
    assert get_renderer("deepseekv3", deepseek_tokenizer).has_extension_property
    # A reply with reasoning cannot be trained without it: say so rather than drop it.
    with pytest.raises(RendererError, match="renders no reasoning"):
        get_renderer("deepseekv3_disable_thinking", deepseek_tokenizer).build_supervised_example(REASONED)


def test_thinking_mode_trains_reasoning_and_drops_it_from_history(deepseek_tokenizer: Tokenizer) -> None:
    whole, trained, prompt = _example(deepseek_tokenizer, "deepseekv3_thinking", REASONED)
    assert whole == f"{BOS}Be brief.<｜User｜>2+2?<｜Assistant｜><think>Add them.</think>4{EOS}"
    assert prompt == f"{BOS}Be brief.<｜User｜>2+2?<｜Assistant｜><think>" and trained == f"Add them.</think>4{EOS}"
    whole, trained, prompt = _example(deepseek_tokenizer, "deepseekv3_thinking", TWO_TURNS)
    assert whole == (f"{BOS}<｜User｜>Hi<｜Assistant｜></think>Hello{EOS}"
                     f"<｜User｜>Bye<｜Assistant｜><think></think>Bye!{EOS}")
    assert whole == prompt + trained


def test_tool_calls_and_results(deepseek_tokenizer: Tokenizer) -> None:
    whole, trained, prompt = _example(deepseek_tokenizer, "deepseekv3", TOOLS)
    assert whole == (
        f"{BOS}<｜User｜>Add 1 and 2<｜Assistant｜></think>Calling.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add"
        f'<｜tool▁sep｜>{{"a": 1, "b": 2}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>{EOS}'
        f"<｜tool▁output▁begin｜>3<｜tool▁output▁end｜>It is 3.{EOS}")
    assert trained == f"It is 3.{EOS}" and whole == prompt + trained  # after results: no role token


def test_a_later_system_message_is_refused(deepseek_tokenizer: Tokenizer) -> None:
    with pytest.raises(RendererError, match=r"messages\[1\] is a system message after the start"):
        get_renderer("deepseekv3", deepseek_tokenizer).build_generation_prompt(
            [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late."}])


@pytest.mark.parametrize(("name", "sampled", "content", "calls", "termination"), [
    ("deepseekv3_thinking", f"Add them.</think>4{EOS}",
     [{"type": "thinking", "thinking": "Add them."}, {"type": "text", "text": "4"}], [], "stop_sequence"),
    ("deepseekv3_thinking", "Still thinking", [{"type": "thinking", "thinking": "Still thinking"},
                                               {"type": "text", "text": ""}], [], "malformed"),
    ("deepseekv3", f'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{{"a": 1}}<｜tool▁call▁end｜>'
                   f"<｜tool▁calls▁end｜>{EOS}", "Sure.", ['add{"a": 1}'], "stop_sequence"),
    ("deepseekv3", f"4{EOS}", "4", [], "stop_sequence"),
])
def test_parse_response(deepseek_tokenizer: Tokenizer, name: str, sampled: str, content: object, calls: list[str],
                        termination: str) -> None:
    renderer = get_renderer(name, deepseek_tokenizer)
    message, ended = renderer.parse_response(deepseek_tokenizer.encode(sampled, add_special_tokens=False))
    assert message["content"] == content and ended == ParseTermination(termination)
    assert [c.function.name + c.function.arguments for c in message.get("tool_calls", [])] == calls


def test_bad_or_unclosed_calls_are_kept_as_unparsed(deepseek_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("deepseekv3", deepseek_tokenizer)
    sampled = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{{a: 1<｜tool▁call▁end｜>{EOS}"
    message, _ = renderer.parse_response(deepseek_tokenizer.encode(sampled, add_special_tokens=False))
    errors = [u.error for u in message["unparsed_tool_calls"]]
    assert "tool_calls" not in message and "not valid JSON" in errors[0] and "not closed" in errors[1]


def test_a_rendered_reply_parses_back_and_streams_to_the_same_message(deepseek_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("deepseekv3_thinking", deepseek_tokenizer)
    reply = trained_tokens(renderer, REASONED)
    message, ended = renderer.parse_response(reply)
    assert message == {"role": "assistant", "content": REASONED[-1]["content"]} and ended.is_stop_sequence
    events, streamed_text, streamed_thinking = stream(renderer, reply)
    assert streamed_thinking == "Add them." and streamed_text == "4"
    assert isinstance(events[-1], StreamingMessageComplete) and events[-1].message == message


def test_missing_special_tokens_and_tool_declarations_are_clear_errors(deepseek_tokenizer: Tokenizer,
                                                                       qwen3_tokenizer: Tokenizer) -> None:
    with pytest.raises(RendererError, match=r"need DeepSeek's tokenizer.*'<｜begin▁of▁sentence｜>'"):
        DeepSeekV3Renderer(qwen3_tokenizer)
    renderer = get_renderer("deepseekv3", deepseek_tokenizer)
    with pytest.raises(RendererError, match="do not declare tools"):
        renderer.create_conversation_prefix_with_tools([{"name": "add", "description": "", "parameters": {}}])
    with pytest.raises(RendererError, match="cannot force a tool call"):
        renderer.tool_call_prefix()
    assert [_text(deepseek_tokenizer, [int(s)]) for s in renderer.get_stop_sequences()] == [EOS]
