"""Token-exact equality with the chat templates that ship with the tokenizers, over seeded random conversations.

Qwen3: the template in the packaged Qwen3 tokenizer (thinking on/off, history thinking stripped, system
prompts, tool declarations, calls and results). ChatML: SmolLM2's template read from its GGUF.
A supervised example ends at the stop token, where the template adds one more ``\\n``; that is dropped.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from random_conversations import Conversation, random_conversation

from tinker_cookbook.renderers import Message, Renderer, get_renderer
from tinker_cookbook.renderers.qwen3 import tool_spec_to_json
from tinker_cookbook.tokenizer_utils import Tokenizer

N_CONVERSATIONS = 120


def _hf_tokens(tokenizer: Tokenizer, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def _ours_and_hf(renderer: Renderer, conv: Conversation, end: int) -> tuple[list[Message], list[dict], dict]:
    """Our messages (tools declared through the renderer) and the template's (tools passed as ``tools=``)."""
    rest = conv.messages[:end]
    hf_kwargs: dict[str, Any] = {}
    system: list[Message] = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    if conv.tools:
        ours = renderer.create_conversation_prefix_with_tools(conv.tools, conv.system_prompt or "") + rest
        import json

        hf_kwargs["tools"] = [json.loads(tool_spec_to_json(t)) for t in conv.tools]
    else:
        ours = system + rest
    hf_messages = [renderer.to_openai_message(m) for m in system + rest]
    return ours, hf_messages, hf_kwargs


def _cut_points(conv: Conversation, roles: tuple[str, ...]) -> list[int]:
    return [i + 1 for i, m in enumerate(conv.messages) if m["role"] in roles]


@pytest.mark.parametrize("renderer_name", ["qwen3", "qwen3_disable_thinking"])
def test_qwen3_generation_prompt_matches_template(qwen3_tokenizer: Tokenizer, renderer_name: str) -> None:
    renderer = get_renderer(renderer_name, qwen3_tokenizer)
    template_kwargs = {"enable_thinking": False} if renderer_name == "qwen3_disable_thinking" else {}
    rng = random.Random(1234)
    compared = 0
    seen: set[str] = set()
    for _ in range(N_CONVERSATIONS):
        conv = random_conversation(rng)
        for end in _cut_points(conv, ("user", "tool")):
            ours, hf, kwargs = _ours_and_hf(renderer, conv, end)
            expected = _hf_tokens(
                qwen3_tokenizer, hf, add_generation_prompt=True, **template_kwargs, **kwargs
            )
            assert renderer.build_generation_prompt(ours).to_ints() == expected, hf
            compared += 1
            seen |= _features(hf, kwargs)
    assert compared > 3 * N_CONVERSATIONS
    assert seen == {"tools", "system", "tool_calls", "reasoning", "inline_think", "grouped_results"}


def _features(hf: list[dict[str, Any]], kwargs: dict[str, Any]) -> set[str]:
    """Which template features a compared case exercised (so the random cases provably cover them all)."""
    found = {"tools"} if kwargs.get("tools") else set()
    for prev, m in zip([None, *hf], hf, strict=False):
        found |= {"system"} if m["role"] == "system" else set()
        found |= {"tool_calls"} if m.get("tool_calls") else set()
        found |= {"reasoning"} if m.get("reasoning_content") else set()
        found |= {"inline_think"} if "</think>" in m["content"] else set()
        found |= {"grouped_results"} if prev and prev["role"] == m["role"] == "tool" else set()
    return found


@pytest.mark.parametrize("renderer_name", ["qwen3", "qwen3_disable_thinking"])
def test_qwen3_supervised_example_matches_template(qwen3_tokenizer: Tokenizer, renderer_name: str) -> None:
    renderer = get_renderer(renderer_name, qwen3_tokenizer)
    rng = random.Random(99)
    thinking_p = 0.0 if renderer_name == "qwen3_disable_thinking" else 0.5
    compared = 0
    for _ in range(N_CONVERSATIONS):
        conv = random_conversation(rng, thinking_p=thinking_p)
        for end in _cut_points(conv, ("assistant",)):
            ours, hf, kwargs = _ours_and_hf(renderer, conv, end)
            expected = _hf_tokens(qwen3_tokenizer, hf, add_generation_prompt=False, **kwargs)
            assert expected[-1] == qwen3_tokenizer.encode("\n")[0]
            model_input, weights = renderer.build_supervised_example(ours)
            assert model_input.to_ints() == expected[:-1], hf
            assert len(weights) == len(expected) - 1
            compared += 1
    assert compared > 2 * N_CONVERSATIONS


def test_qwen3_history_thinking_is_stripped_like_the_template(qwen3_tokenizer: Tokenizer) -> None:
    """A hand-picked case of what the random tests cover: old reasoning disappears, the latest stays."""
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    messages: list[Message] = [
        {"role": "user", "content": "What is 2+2?"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "Add."}, {"type": "text", "text": "4"}],
        },
        {"role": "user", "content": "And 3+3?"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "Add again."}, {"type": "text", "text": "6"}],
        },
    ]
    model_input, _ = renderer.build_supervised_example(messages)
    assert qwen3_tokenizer.decode(model_input.to_ints()) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nAdd again.\n</think>\n\n6<|im_end|>"
    )


def test_chatml_matches_smollm2_template(smollm2_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("chatml", smollm2_tokenizer)
    rng = random.Random(7)
    compared = 0
    for _ in range(N_CONVERSATIONS):
        conv = random_conversation(rng, with_tools=False, thinking_p=0.0)
        system: list[Message] = (
            [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        )
        for end in range(1, len(conv.messages) + 1):
            messages = system + conv.messages[:end]
            hf = [renderer.to_openai_message(m) for m in messages]
            if messages[-1]["role"] == "user":
                expected = _hf_tokens(smollm2_tokenizer, hf, add_generation_prompt=True)
                assert renderer.build_generation_prompt(messages).to_ints() == expected, hf
            else:
                expected = _hf_tokens(smollm2_tokenizer, hf, add_generation_prompt=False)
                assert renderer.build_supervised_example(messages)[0].to_ints() == expected[:-1], hf
            compared += 1
    assert compared > 2 * N_CONVERSATIONS


def test_chatml_inserts_smollm2_default_system_prompt(smollm2_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("chatml", smollm2_tokenizer)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "Hi"}])
    assert smollm2_tokenizer.decode(prompt.to_ints()) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
