"""Kimi-K2's format (kimi_k2), checked as text against hand-written strings of the model's published template. No
Kimi tokenizer ships offline: the tokenizer here is Qwen3's with Kimi's special tokens added (``kimi_tokenizer``)."""

from __future__ import annotations

import pytest

from tests.renderers.round_trip import stream, trained_tokens
from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers import (
    KimiK2Renderer,
    Message,
    ParseTermination,
    StreamingMessageComplete,
    ToolCall,
    get_renderer,
)
from tinker_cookbook.renderers.base import FunctionBody
from tinker_cookbook.tokenizer_utils import Tokenizer

DEFAULT_SYSTEM = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
ASSISTANT = "<|im_assistant|>assistant<|im_middle|>"
# Kimi's call ids name the function (functions.NAME:INDEX): the format has no other place for the name.
CALL = ToolCall(id="functions.add:0", function=FunctionBody(name="add", arguments='{"a": 1}'))
CALL_TEXT = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
             '{"a": 1}<|tool_call_end|><|tool_calls_section_end|>')


def _example(tokenizer: Tokenizer, messages: list[Message]) -> tuple[str, str, str]:
    """The whole example, its trained part, and the generation prompt before its last message."""
    renderer = get_renderer("kimi_k2", tokenizer)
    model_input, weights = renderer.build_supervised_example(messages)
    ids = model_input.to_ints()
    trained = [t for t, w in zip(ids, weights.tolist(), strict=True) if w]
    prompt = renderer.build_generation_prompt(messages[:-1]).to_ints()
    return tuple(str(tokenizer.decode(x, skip_special_tokens=False)) for x in (ids, trained, prompt))  # type: ignore[return-value]


def test_reasoning_is_trained_and_history_keeps_an_empty_think_block(kimi_tokenizer: Tokenizer) -> None:
    whole, trained, prompt = _example(kimi_tokenizer, [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "A greeting."},
                                          {"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Leaving."},
                                          {"type": "text", "text": "Bye!"}]},
    ])
    assert whole == (f"{DEFAULT_SYSTEM}<|im_user|>user<|im_middle|>Hi<|im_end|>{ASSISTANT}<think></think>Hello<|im_end|>"
                     f"<|im_user|>user<|im_middle|>Bye<|im_end|>{ASSISTANT}<think>Leaving.</think>Bye!<|im_end|>")
    assert trained == "<think>Leaving.</think>Bye!<|im_end|>" and whole == prompt + trained
    assert not get_renderer("kimi_k2", kimi_tokenizer).has_extension_property


def test_a_system_message_replaces_the_default(kimi_tokenizer: Tokenizer) -> None:
    whole, _, _ = _example(kimi_tokenizer, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
    assert whole == ("<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>2+2?<|im_end|>"
                     f"{ASSISTANT}<think></think>4<|im_end|>")


def test_tool_calls_and_results_keep_the_turn_s_reasoning(kimi_tokenizer: Tokenizer) -> None:
    whole, trained, prompt = _example(kimi_tokenizer, [
        {"role": "user", "content": "Add"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool."},
                                          {"type": "text", "text": ""}], "tool_calls": [CALL]},
        {"role": "tool", "name": "add", "tool_call_id": "functions.add:0", "content": "3"},
        {"role": "assistant", "content": "It is 3."},
    ])
    assert whole == (f"{DEFAULT_SYSTEM}<|im_user|>user<|im_middle|>Add<|im_end|>{ASSISTANT}<think>Use the tool.</think>"
                     f"{CALL_TEXT}<|im_end|><|im_system|>add<|im_middle|>## Return of functions.add:0\n3<|im_end|>"
                     f"{ASSISTANT}<think></think>It is 3.<|im_end|>")
    assert whole == prompt + trained
    with pytest.raises(RendererError, match=r"messages\[2\] is a tool result without 'tool_call_id'"):
        get_renderer("kimi_k2", kimi_tokenizer).build_generation_prompt([
            {"role": "user", "content": "Add"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "name": "add", "content": "3"}])


@pytest.mark.parametrize(("sampled", "content", "calls", "termination"), [
    ("<think>Add.</think>4<|im_end|>", [{"type": "thinking", "thinking": "Add."}, {"type": "text", "text": "4"}], [],
     "stop_sequence"),
    (f"<think></think>Sure.{CALL_TEXT}<|im_end|>", "Sure.", ['functions.add:0 add{"a": 1}'], "stop_sequence"),
    ('<think></think><|tool_calls_section_begin|><|tool_call_begin|>functions.mul:1<|tool_call_argument_begin|>{}'
     "<|tool_call_end|><|tool_calls_section_end|><|im_end|>", "", ["functions.mul:1 mul{}"], "stop_sequence"),
    ("<think>Still thinking", [{"type": "thinking", "thinking": "Still thinking"}, {"type": "text", "text": ""}], [],
     "malformed"),
])
def test_parse_response(kimi_tokenizer: Tokenizer, sampled: str, content: object, calls: list[str],
                        termination: str) -> None:
    renderer = get_renderer("kimi_k2", kimi_tokenizer)
    message, ended = renderer.parse_response(kimi_tokenizer.encode(sampled, add_special_tokens=False))
    assert message["content"] == content and ended == ParseTermination(termination)
    assert [f"{c.id} {c.function.name}{c.function.arguments}" for c in message.get("tool_calls", [])] == calls


def test_a_rendered_reply_parses_back_and_streams_to_the_same_message(kimi_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("kimi_k2", kimi_tokenizer)
    reply: Message = {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use it."},
                                                       {"type": "text", "text": "Calling."}], "tool_calls": [CALL]}
    tokens = trained_tokens(renderer, [{"role": "user", "content": "Add"}, reply])
    message, ended = renderer.parse_response(tokens)
    assert message == reply and ended.is_stop_sequence
    events, streamed_text, streamed_thinking = stream(renderer, tokens)
    assert streamed_thinking == "Use it." and streamed_text == "Calling."
    assert isinstance(events[-1], StreamingMessageComplete) and events[-1].message == message


def test_missing_special_tokens_and_tool_declarations_are_clear_errors(kimi_tokenizer: Tokenizer,
                                                                       qwen3_tokenizer: Tokenizer) -> None:
    with pytest.raises(RendererError, match=r"needs Kimi's tokenizer.*'<\|im_system\|>'"):
        KimiK2Renderer(qwen3_tokenizer)
    renderer = get_renderer("kimi_k2", kimi_tokenizer)
    with pytest.raises(RendererError, match="do not declare tools"):
        renderer.create_conversation_prefix_with_tools([{"name": "add", "description": "", "parameters": {}}])
    with pytest.raises(RendererError, match="cannot force a tool call"):
        renderer.tool_call_prefix()
    [stop] = renderer.get_stop_sequences()
    assert kimi_tokenizer.decode([int(stop)]) == "<|im_end|>"
