"""parse_response: stop sequence vs EOS vs malformed, tool calls, and render/parse round trips."""

from __future__ import annotations

import random

import pytest
from random_conversations import random_conversation

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers import Message, ParseTermination, Renderer, get_renderer
from tinker_cookbook.tokenizer_utils import Tokenizer


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_parse_termination_truthiness() -> None:
    assert ParseTermination.STOP_SEQUENCE and ParseTermination.EOS
    assert not ParseTermination.MALFORMED
    assert ParseTermination.STOP_SEQUENCE.is_stop_sequence and not ParseTermination.EOS.is_stop_sequence
    assert [t.is_clean for t in ParseTermination] == [True, True, False]


@pytest.mark.parametrize(
    ("renderer_name", "tokenizer_name", "stop", "eos"),
    [
        ("qwen3", "qwen3", "<|im_end|>", "<|endoftext|>"),
        ("qwen3_instruct", "qwen3", "<|im_end|>", "<|endoftext|>"),
        ("llama3", "llama3", "<|eot_id|>", "<|end_of_text|>"),
        ("chatml", "smollm2", "<|im_end|>", "<|endoftext|>"),
    ],
)
def test_stop_token_contract(
    request: pytest.FixtureRequest, renderer_name: str, tokenizer_name: str, stop: str, eos: str
) -> None:
    tokenizer = request.getfixturevalue(f"{tokenizer_name}_tokenizer")
    renderer = get_renderer(renderer_name, tokenizer)
    assert renderer.get_stop_sequences() == _encode(tokenizer, stop)

    message, ok = renderer.parse_response(_encode(tokenizer, f"The answer is 4.{stop}"))
    assert ok is ParseTermination.STOP_SEQUENCE and ok
    assert message == {"role": "assistant", "content": "The answer is 4."}

    message, ok = renderer.parse_response(_encode(tokenizer, f"The answer is 4.{eos}"))
    assert ok is ParseTermination.EOS and ok
    assert message["content"] == "The answer is 4."

    message, ok = renderer.parse_response(_encode(tokenizer, "The answer is"))
    assert ok is ParseTermination.MALFORMED and not ok
    assert message["content"] == "The answer is"

    with pytest.raises(RendererError, match="2 stop tokens"):
        renderer.parse_response(_encode(tokenizer, f"a{stop}b{stop}"))


@pytest.mark.parametrize("tokenizer_name", ["qwen3", "llama3", "smollm2"])
def test_role_colon_base_model_eos_is_not_a_failure(
    request: pytest.FixtureRequest, tokenizer_name: str
) -> None:
    tokenizer = request.getfixturevalue(f"{tokenizer_name}_tokenizer")
    renderer = get_renderer("role_colon", tokenizer)
    assert renderer.get_stop_sequences() == ["\n\nUser:"]
    eos = {"qwen3": "<|endoftext|>", "llama3": "<|end_of_text|>", "smollm2": "<|endoftext|>"}[tokenizer_name]

    message, ok = renderer.parse_response(_encode(tokenizer, " 4\n\nUser:"))
    assert (message["content"], ok) == ("4", ParseTermination.STOP_SEQUENCE)
    # A base model that simply ends its text: clean, and told apart from the stop sequence.
    message, ok = renderer.parse_response(_encode(tokenizer, f" 4{eos}"))
    assert (message["content"], ok) == ("4", ParseTermination.EOS) and ok
    # Sampling overshot the stop string inside the last token: keep what precedes it.
    message, ok = renderer.parse_response(_encode(tokenizer, " 4\n\nUser: and"))
    assert (message["content"], ok) == ("4", ParseTermination.STOP_SEQUENCE)
    message, ok = renderer.parse_response(_encode(tokenizer, " 4 and then"))
    assert (message["content"], ok) == ("4 and then", ParseTermination.MALFORMED) and not ok


def test_qwen3_parses_thinking_and_tool_calls(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    text = (
        "<think>\nNeed the weather.\n</think>\n\nLet me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>'
    )
    message, ok = renderer.parse_response(_encode(qwen3_tokenizer, text))
    assert ok is ParseTermination.STOP_SEQUENCE
    assert message["content"] == [
        {"type": "thinking", "thinking": "Need the weather."},
        {"type": "text", "text": "Let me check."},
    ]
    calls = message["tool_calls"]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]
    assert "unparsed_tool_calls" not in message


@pytest.mark.parametrize(
    ("block", "error"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {oops}}\n</tool_call>', "invalid JSON"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "name"),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', "arguments"),
        ('<tool_call>\n{"name": "f", "arguments": {}}', "unterminated"),
    ],
)
def test_qwen3_bad_tool_calls_become_unparsed(qwen3_tokenizer: Tokenizer, block: str, error: str) -> None:
    renderer = get_renderer("qwen3_instruct", qwen3_tokenizer)
    message, ok = renderer.parse_response(_encode(qwen3_tokenizer, f"Calling.\n{block}<|im_end|>"))
    assert ok and message["content"] == "Calling."
    assert "tool_calls" not in message
    (unparsed,) = message["unparsed_tool_calls"]
    assert error in unparsed.error and unparsed.raw_text == block


@pytest.mark.parametrize("renderer_name", ["qwen3", "qwen3_instruct", "qwen3_disable_thinking"])
def test_qwen3_sampled_messages_round_trip(qwen3_tokenizer: Tokenizer, renderer_name: str) -> None:
    """Parsing the trained part of a supervised example and rendering it again gives the same tokens."""
    renderer = get_renderer(renderer_name, qwen3_tokenizer)
    rng = random.Random(11)
    thinking_p = 0.5 if renderer_name == "qwen3" else 0.0
    checked = 0
    for _ in range(30):
        messages = random_conversation(rng, thinking_p=thinking_p).messages
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                checked += _round_trips(renderer, messages[: i + 1])
    assert checked > 30


def _round_trips(renderer: Renderer, messages: list[Message]) -> int:
    prompt = renderer.build_generation_prompt(messages[:-1]).to_ints()
    full = renderer.build_supervised_example(messages)[0].to_ints()
    sampled = full[len(prompt) :]
    parsed, ok = renderer.parse_response(sampled)
    assert ok is ParseTermination.STOP_SEQUENCE
    again = renderer.build_supervised_example([*messages[:-1], parsed])[0].to_ints()
    assert again == full, (messages[-1], parsed)
    return 1


@pytest.mark.parametrize(
    ("renderer_name", "tokenizer_name"),
    [("llama3", "llama3"), ("chatml", "smollm2"), ("role_colon", "qwen3")],
)
def test_text_renderers_round_trip(
    request: pytest.FixtureRequest, renderer_name: str, tokenizer_name: str
) -> None:
    renderer = get_renderer(renderer_name, request.getfixturevalue(f"{tokenizer_name}_tokenizer"))
    messages: list[Message] = [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "Seven, 7 — it's prime."},
    ]
    assert _round_trips(renderer, messages) == 1
