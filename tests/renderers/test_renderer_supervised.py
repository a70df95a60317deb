"""Supervised examples: which tokens TrainOnWhat trains, prompt/completion consistency, the extension property."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from random_conversations import random_conversation

from tinker_cookbook.renderers import Message, Renderer, ToolCall, TrainOnWhat, get_renderer
from tinker_cookbook.renderers.base import FunctionBody
from tinker_cookbook.renderers.qwen3 import Qwen3Renderer
from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import Tokenizer


def trained_runs(tokenizer: Tokenizer, model_input: types.ModelInput, weights: torch.Tensor) -> list[str]:
    """The decoded runs of consecutive weight-1 tokens."""
    tokens = model_input.to_ints()
    assert weights.dtype == torch.float32 and weights.shape == (len(tokens),)
    assert set(weights.tolist()) <= {0.0, 1.0}
    runs: list[list[int]] = []
    for i, (token, w) in enumerate(zip(tokens, weights.tolist(), strict=True)):
        if w == 1.0:
            if i == 0 or weights[i - 1] != 1.0:
                runs.append([])
            runs[-1].append(token)
    return [tokenizer.decode(run) for run in runs]


WEATHER_CALL = ToolCall(id="c1", function=FunctionBody(name="get_weather", arguments='{"city": "Paris"}'))
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'

TOOL_CONVERSATION: list[Message] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You're welcome."},
]

LAST = "<think>\n\n</think>\n\nYou're welcome.<|im_end|>"

EXPECTED_QWEN3_RUNS = {
    TrainOnWhat.LAST_ASSISTANT_MESSAGE: [LAST],
    TrainOnWhat.LAST_ASSISTANT_TURN: [LAST],
    TrainOnWhat.ALL_ASSISTANT_MESSAGES: [CALL_TEXT, "It is sunny.<|im_end|>", LAST],
    TrainOnWhat.ALL_MESSAGES: [
        "Be brief.<|im_end|>",
        "Weather in Paris?<|im_end|>",
        CALL_TEXT,
        "\n<tool_response>\nsunny\n</tool_response><|im_end|>",
        "It is sunny.<|im_end|>",
        "Thanks!<|im_end|>",
        LAST,
    ],
    TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES: [
        "Be brief.<|im_end|>",
        "Weather in Paris?<|im_end|>",
        "Thanks!<|im_end|>",
    ],
}


@pytest.mark.parametrize("train_on_what", list(EXPECTED_QWEN3_RUNS))
def test_qwen3_weights_per_train_on_what(qwen3_tokenizer: Tokenizer, train_on_what: TrainOnWhat) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    model_input, weights = renderer.build_supervised_example(TOOL_CONVERSATION, train_on_what)
    assert trained_runs(qwen3_tokenizer, model_input, weights) == EXPECTED_QWEN3_RUNS[train_on_what]


def test_all_tokens_trains_everything_including_headers(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    model_input, weights = renderer.build_supervised_example(TOOL_CONVERSATION, TrainOnWhat.ALL_TOKENS)
    assert weights.tolist() == [1.0] * model_input.length


def test_customized_uses_trainable_flags(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    messages = [{**m, "trainable": i in (1, 4)} for i, m in enumerate(TOOL_CONVERSATION)]
    model_input, weights = renderer.build_supervised_example(messages, "customized")  # type: ignore[arg-type]
    runs = trained_runs(qwen3_tokenizer, model_input, weights)
    assert runs == ["Weather in Paris?<|im_end|>", "It is sunny.<|im_end|>"]


def test_last_assistant_turn_covers_tool_steps(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    turn = TOOL_CONVERSATION[:5]
    last_turn = trained_runs(
        qwen3_tokenizer, *renderer.build_supervised_example(turn, TrainOnWhat.LAST_ASSISTANT_TURN)
    )
    assert last_turn == [CALL_TEXT, "<think>\n\n</think>\n\nIt is sunny.<|im_end|>"]
    last = trained_runs(qwen3_tokenizer, *renderer.build_supervised_example(turn))
    assert last == ["<think>\n\n</think>\n\nIt is sunny.<|im_end|>"]


def test_disable_thinking_leaves_the_prefilled_block_untrained(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3_disable_thinking", qwen3_tokenizer)
    model_input, weights = renderer.build_supervised_example(TOOL_CONVERSATION)
    assert trained_runs(qwen3_tokenizer, model_input, weights) == ["You're welcome.<|im_end|>"]
    assert qwen3_tokenizer.decode(model_input.to_ints()).endswith(LAST)


def test_role_colon_text_and_weights(llama3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("role_colon", llama3_tokenizer)
    messages: list[Message] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Ciao"},
    ]
    model_input, weights = renderer.build_supervised_example(messages, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    assert llama3_tokenizer.decode(model_input.to_ints()) == (
        "<|begin_of_text|>System: Be brief.\n\nUser: Hi\n\nAssistant: Hello\n\nUser: Bye\n\nAssistant: Ciao\n\nUser:"
    )
    # "User:" after the final reply is trained: it completes the stop sequence the model must learn to emit.
    assert trained_runs(llama3_tokenizer, model_input, weights) == [" Hello\n\n", " Ciao\n\nUser:"]
    _, last_weights = renderer.build_supervised_example(messages)
    assert trained_runs(llama3_tokenizer, model_input, last_weights) == [" Ciao\n\nUser:"]


# ---------------------------------------------------------------------------------------------------------
# Prompt part of a supervised example == generation prompt of the same prefix
# ---------------------------------------------------------------------------------------------------------

PREFIX_CASES = [
    ("role_colon", "qwen3", False, 0.0),
    ("role_colon", "smollm2", False, 0.0),
    ("llama3", "llama3", False, 0.0),
    ("chatml", "smollm2", False, 0.0),
    ("qwen3", "qwen3", True, 0.5),
    ("qwen3_disable_thinking", "qwen3", True, 0.0),
    ("qwen3_instruct", "qwen3", True, 0.0),
    ("qwen3_vl", "qwen3", True, 0.5),
    ("qwen3_vl_instruct", "qwen3", True, 0.0),
]


@pytest.mark.parametrize(("renderer_name", "tokenizer_name", "with_tools", "thinking_p"), PREFIX_CASES)
def test_supervised_prompt_part_is_the_generation_prompt(
    request: pytest.FixtureRequest,
    renderer_name: str,
    tokenizer_name: str,
    with_tools: bool,
    thinking_p: float,
) -> None:
    tokenizer = request.getfixturevalue(f"{tokenizer_name}_tokenizer")
    renderer = get_renderer(renderer_name, tokenizer)
    rng = random.Random(renderer_name)
    checked = 0
    for _ in range(25):
        conv = random_conversation(rng, with_tools=with_tools, thinking_p=thinking_p)
        head: list[Message] = []
        if conv.tools:
            head = renderer.create_conversation_prefix_with_tools(conv.tools, conv.system_prompt or "")
        elif conv.system_prompt:
            head = [{"role": "system", "content": conv.system_prompt}]
        messages = head + conv.messages
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = renderer.build_generation_prompt(messages[:i]).to_ints()
            model_input, weights = renderer.build_supervised_example(messages[: i + 1])
            tokens = model_input.to_ints()
            assert tokens[: len(prompt)] == prompt
            assert weights[: len(prompt)].sum() == 0
            assert bool((weights[len(prompt) :] == 1).all()) and len(tokens) > len(prompt)
            checked += 1
    assert checked >= 25


# ---------------------------------------------------------------------------------------------------------
# Extension property (docs: "Sequence Extension Property in Multi-Turn RL")
# ---------------------------------------------------------------------------------------------------------


def _observations_and_actions(
    renderer: Renderer, messages: list[Message]
) -> list[tuple[list[int], list[int]]]:
    """(observation, action) token lists for each assistant message, as an RL rollout would see them."""
    steps = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            ob = renderer.build_generation_prompt(messages[:i]).to_ints()
            full = renderer.build_supervised_example(messages[: i + 1])[0].to_ints()
            assert full[: len(ob)] == ob
            steps.append((ob, full[len(ob) :]))
    return steps


def _extends(steps: list[tuple[list[int], list[int]]]) -> bool:
    return all(
        ob_next[: len(ob) + len(ac)] == ob + ac for (ob, ac), (ob_next, _) in itertools.pairwise(steps)
    )


def _math_conversation() -> list[Message]:
    def reply(answer: str) -> Message:
        return {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me calculate..."},
                {"type": "text", "text": answer},
            ],
        }

    return [
        {"role": "user", "content": "What is 2+2?"},
        reply("4"),
        {"role": "user", "content": "What is 3+3?"},
        reply("6"),
    ]


def test_qwen3_extension_holds_with_thinking_visible(qwen3_tokenizer: Tokenizer) -> None:
    renderer = Qwen3Renderer(qwen3_tokenizer, strip_thinking_from_history=False)
    assert renderer.has_extension_property
    (ob1, ac1), (ob2, _) = _observations_and_actions(renderer, _math_conversation())
    assert ob2[: len(ob1) + len(ac1)] == ob1 + ac1
    assert qwen3_tokenizer.decode(ob2[len(ob1) + len(ac1) :]) == (
        "\n<|im_start|>user\nWhat is 3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Extension holds, so one example trains both replies.
    examples = renderer.build_supervised_examples(_math_conversation(), TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    assert len(examples) == 1
    runs = trained_runs(qwen3_tokenizer, *examples[0])
    assert runs == [f"<think>\nLet me calculate...\n</think>\n\n{a}<|im_end|>" for a in "46"]


def test_qwen3_extension_breaks_with_thinking_stripped(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    assert not renderer.has_extension_property
    steps = _observations_and_actions(renderer, _math_conversation())
    assert not _extends(steps)
    assert qwen3_tokenizer.decode(steps[1][0]) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nWhat is 3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Without extension each reply gets its own example, rendered in the context it was sampled in.
    examples = renderer.build_supervised_examples(_math_conversation(), TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    assert len(examples) == 2
    for (ob, ac), (model_input, weights) in zip(steps, examples, strict=True):
        assert model_input.to_ints() == ob + ac
        assert weights.tolist() == [0.0] * len(ob) + [1.0] * len(ac)


@pytest.mark.parametrize(
    ("renderer_name", "tokenizer_name", "expected"),
    [
        ("role_colon", "llama3", True),
        ("llama3", "llama3", True),
        ("chatml", "smollm2", True),
        ("qwen3_instruct", "qwen3", True),
        ("qwen3_vl_instruct", "qwen3", True),
        ("qwen3", "qwen3", False),
        ("qwen3_disable_thinking", "qwen3", False),
        ("qwen3_vl", "qwen3", False),
    ],
)
def test_extension_property_flag_matches_behaviour(
    request: pytest.FixtureRequest, renderer_name: str, tokenizer_name: str, expected: bool
) -> None:
    renderer = get_renderer(renderer_name, request.getfixturevalue(f"{tokenizer_name}_tokenizer"))
    assert renderer.has_extension_property is expected
    rng = random.Random(5)
    qwen = tokenizer_name == "qwen3"
    results = []
    for _ in range(15):
        conv = random_conversation(rng, with_tools=qwen, thinking_p=0.5 if renderer_name == "qwen3" else 0.0)
        if sum(m["role"] == "assistant" for m in conv.messages) >= 2:
            results.append(_extends(_observations_and_actions(renderer, conv.messages)))
    assert results
    if expected:
        assert all(results)
    else:
        # Qwen3's template drops history framing (thinking, empty think blocks), so some step must break.
        assert not all(results)


def test_generation_prompt_role_and_prefill(qwen3_tokenizer: Tokenizer, llama3_tokenizer: Tokenizer) -> None:
    messages: list[Message] = [{"role": "user", "content": "Pick a number."}]
    qwen = get_renderer("qwen3_instruct", qwen3_tokenizer)
    prompt = qwen.build_generation_prompt(messages, prefill="My number is")
    assert qwen3_tokenizer.decode(prompt.to_ints()).endswith("<|im_start|>assistant\nMy number is")
    # Another role: e.g. to sample a simulated user.
    as_user = qwen.build_generation_prompt([*messages, {"role": "assistant", "content": "7"}], role="user")
    assert qwen3_tokenizer.decode(as_user.to_ints()).endswith("7<|im_end|>\n<|im_start|>user\n")
    colon = get_renderer("role_colon", llama3_tokenizer)
    assert llama3_tokenizer.decode(colon.build_generation_prompt(messages, prefill=" 4").to_ints()) == (
        "<|begin_of_text|>User: Pick a number.\n\nAssistant: 4"
    )
