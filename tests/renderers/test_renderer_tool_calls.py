"""Tool calls in every renderer that has a format for them: render -> parse round trips with the real tokenizers,
the exact Llama 3.1 JSON and ChatML strings, prefilled call openings, and malformed calls."""

from __future__ import annotations

import json

import pytest

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers import (
    FunctionBody,
    Message,
    ParseTermination,
    Renderer,
    ToolCall,
    ToolSpec,
    get_renderer,
    get_text_content,
)
from tinker_cookbook.tokenizer_utils import Tokenizer

TOOL_RENDERERS = [("qwen3", "qwen3"), ("qwen3_disable_thinking", "qwen3"), ("qwen3_instruct", "qwen3"),
                  ("llama3", "llama3"), ("chatml_tools", "smollm2")]
SPEC: ToolSpec = {"name": "search", "description": "Search the encyclopedia.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def _call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(function=FunctionBody(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))


def _renderer(request: pytest.FixtureRequest, name: str, tokenizer: str) -> Renderer:
    return get_renderer(name, request.getfixturevalue(f"{tokenizer}_tokenizer"))


def _episode(renderer: Renderer, calls: list[ToolCall]) -> list[Message]:
    messages = renderer.create_conversation_prefix_with_tools([SPEC], "Be brief.")
    messages += [{"role": "user", "content": "Who founded Quarrowby? Use the tool."},
                 {"role": "assistant", "content": "", "tool_calls": calls}]
    messages += [{"role": "tool", "content": f"result {i}: Ilsa Thorne, in 1412", "name": "search"}
                 for i in range(len(calls))]
    return [*messages, {"role": "assistant", "content": "Ilsa Thorne."}]


def _sampled_tokens(renderer: Renderer, messages: list[Message], i: int) -> list[int]:
    """The tokens a model samples for ``messages[i]``: its rendering after the generation prompt."""
    prompt = renderer.build_generation_prompt(messages[:i]).to_ints()
    full = renderer.build_supervised_example(messages[: i + 1])[0].to_ints()
    assert full[: len(prompt)] == prompt
    return full[len(prompt):]


@pytest.mark.parametrize(("name", "tokenizer"), TOOL_RENDERERS)
@pytest.mark.parametrize("arguments", [{"query": "Quarrowby founder"}, {"query": "naïve \"quotes\" {braces}"}, {}])
def test_tool_call_round_trip(request: pytest.FixtureRequest, name: str, tokenizer: str, arguments: dict) -> None:
    renderer = _renderer(request, name, tokenizer)
    messages = _episode(renderer, [_call("search", **arguments)])
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        sampled = _sampled_tokens(renderer, messages, i)
        parsed, termination = renderer.parse_response(sampled)
        assert termination is ParseTermination.STOP_SEQUENCE
        assert parsed.get("tool_calls", []) == message.get("tool_calls", [])
        assert not parsed.get("unparsed_tool_calls")
        if message.get("tool_calls"):
            assert json.loads(parsed["tool_calls"][0].function.arguments) == arguments
        # Rendering the parsed message gives the sampled tokens back (training sees what was sampled).
        again = renderer.build_supervised_example([*messages[:i], parsed])[0].to_ints()
        assert again == renderer.build_supervised_example(messages[: i + 1])[0].to_ints()


@pytest.mark.parametrize(("name", "tokenizer"), [r for r in TOOL_RENDERERS if r[0] != "llama3"])
def test_several_calls_in_one_reply_round_trip(request: pytest.FixtureRequest, name: str, tokenizer: str) -> None:
    renderer = _renderer(request, name, tokenizer)
    calls = [_call("search", query="Quarrowby"), _call("search", query="Ilsa Thorne")]
    messages = _episode(renderer, calls)
    parsed, _ = renderer.parse_response(_sampled_tokens(renderer, messages, len(messages) - 4))
    assert parsed["tool_calls"] == calls


@pytest.mark.parametrize(("name", "tokenizer"), TOOL_RENDERERS)
def test_prefilled_call_opening_parses_with_the_sampled_rest(request: pytest.FixtureRequest, name: str,
                                                            tokenizer: str) -> None:
    """A reply sampled after ``tool_call_prefix`` is parsed from the prefill's tokens plus the sampled ones."""
    renderer = _renderer(request, name, tokenizer)
    messages = _episode(renderer, [_call("search", query="Quarrowby")])
    i = len(messages) - 3  # the assistant message with the call
    text = renderer.decode(_sampled_tokens(renderer, messages, i))
    prefill = renderer.tool_call_prefix("search")
    assert text.startswith(prefill)
    prompt = renderer.build_generation_prompt(messages[:i], prefill=prefill).to_ints()
    assert prompt[-len(renderer.encode(prefill)):] == renderer.encode(prefill)
    # Token boundaries at the end of a prefill can differ from the full rendering's, so the rest is re-encoded.
    parsed, ok = renderer.parse_response(renderer.encode(prefill) + renderer.encode(text[len(prefill):]))
    assert ok and parsed["tool_calls"] == messages[i]["tool_calls"]


def test_llama3_json_tool_call_strings(llama3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("llama3", llama3_tokenizer)
    messages = _episode(renderer, [_call("search", query="Quarrowby")])
    text = renderer.decode(renderer.build_generation_prompt(messages).to_ints())
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "search", "parameters": {"query": '
            '"Quarrowby"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\nresult 0: Ilsa Thorne, in 1412'
            '<|eot_id|>') in text
    system = get_text_content(messages[0])
    assert system.startswith("You have access to the following functions.") and system.endswith("\n\nBe brief.")
    assert json.loads(system.split("variables.\n\n")[1].removesuffix("\n\nBe brief."))["function"] == SPEC


@pytest.mark.parametrize(("reply", "expected"), [
    ('<|python_tag|>{"name": "search", "parameters": {"query": "x"}}', {"tool": ("search", {"query": "x"})}),
    ('{"name": "search", "arguments": {"query": "x"}}', {"tool": ("search", {"query": "x"})}),
    ('{"name": "search", "parameters": {"query": "x"', {"unparsed": "invalid JSON"}),
    ('{"name": "search", "parameters": "x"}', {"unparsed": "'parameters' object"}),
    ('{"score": 3}', {"text": '{"score": 3}'}),
    ("Ilsa Thorne founded it.", {"text": "Ilsa Thorne founded it."}),
])
def test_llama3_parses_json_calls(llama3_tokenizer: Tokenizer, reply: str, expected: dict) -> None:
    renderer = get_renderer("llama3", llama3_tokenizer)
    message, ok = renderer.parse_response(llama3_tokenizer.encode(reply + "<|eot_id|>", add_special_tokens=False))
    assert ok
    if "tool" in expected:
        (call,) = message["tool_calls"]
        assert (call.function.name, json.loads(call.function.arguments)) == expected["tool"]
    elif "unparsed" in expected:
        (bad,) = message["unparsed_tool_calls"]
        assert expected["unparsed"] in bad.error and bad.raw_text == reply
    else:
        assert message["content"] == expected["text"] and "tool_calls" not in message


def test_llama3_refuses_what_its_format_cannot_hold(llama3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("llama3", llama3_tokenizer)
    user: Message = {"role": "user", "content": "hi"}
    two_calls: Message = {"role": "assistant", "content": "", "tool_calls": [_call("a"), _call("b")]}
    with pytest.raises(RendererError, match=r"messages\[1\] has 2 tool call\(s\).*exactly one call"):
        renderer.build_generation_prompt([user, two_calls])
    with pytest.raises(RendererError, match=r"messages\[1\] has 1 tool call\(s\) and text 'Let me look'"):
        renderer.build_generation_prompt([user, {"role": "assistant", "content": "Let me look",
                                                 "tool_calls": [_call("a")]}])
    thinking: Message = {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}
    with pytest.raises(RendererError, match="has thinking parts but Llama3Renderer has no reasoning format"):
        renderer.build_generation_prompt([user, thinking])


def test_chatml_tools_without_tools_is_chatml(smollm2_tokenizer: Tokenizer) -> None:
    chatml = get_renderer("chatml", smollm2_tokenizer)
    tools = get_renderer("chatml_tools", smollm2_tokenizer)
    conversation: list[Message] = [{"role": "user", "content": "Name a prime."},
                                   {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "More?"}]
    assert tools.build_generation_prompt(conversation).to_ints() == chatml.build_generation_prompt(
        conversation).to_ints()
    model_input, weights = tools.build_supervised_example(conversation[:2])
    expected_input, expected_weights = chatml.build_supervised_example(conversation[:2])
    assert model_input.to_ints() == expected_input.to_ints() and weights.tolist() == expected_weights.tolist()


def test_chatml_tools_call_and_result_text(smollm2_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("chatml_tools", smollm2_tokenizer)
    messages = _episode(renderer, [_call("search", query="Quarrowby")])
    text = renderer.decode(renderer.build_generation_prompt(messages).to_ints())
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "Quarrowby"}}\n'
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nresult 0: Ilsa Thorne, in 1412\n"
            "</tool_response><|im_end|>") in text
    assert text.startswith("<|im_start|>system\nBe brief.\n\nTools:\n{\"type\": \"function\"") and "You are a helpful" not in text
