"""Llama-3: exact strings of the documented format (the packaged tokenizer ships no chat template)."""

from __future__ import annotations

import random

from random_conversations import random_conversation

from tinker_cookbook.renderers import Message, get_renderer
from tinker_cookbook.tokenizer_utils import Tokenizer


def documented_format(messages: list[Message], generation: bool) -> str:
    """``<|begin_of_text|>`` then ``<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>`` per message."""
    text = "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in messages
    )
    return text + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if generation else "")


def test_llama3_generation_prompt_exact(llama3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("llama3", llama3_tokenizer)
    messages: list[Message] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
    ]
    tokens = renderer.build_generation_prompt(messages).to_ints()
    assert llama3_tokenizer.decode(tokens) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # Ids from the Llama-3 tokenizer: BOS 128000, headers 128006/128007, end of turn 128009.
    assert tokens[:2] == [128000, 128006] and tokens.count(128009) == 2 and tokens[-2:] == [128007, 271]
    assert renderer.get_stop_sequences() == [128009]


def test_llama3_random_conversations_match_documented_format(llama3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("llama3", llama3_tokenizer)
    rng = random.Random(3)
    for _ in range(40):
        conv = random_conversation(rng, with_tools=False, thinking_p=0.0)
        system: list[Message] = (
            [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        )
        messages = system + conv.messages
        expected = documented_format(messages, generation=False)
        model_input, weights = renderer.build_supervised_example(messages)
        assert model_input.to_ints() == llama3_tokenizer.encode(expected, add_special_tokens=False)
        trained = [t for t, w in zip(model_input.to_ints(), weights.tolist(), strict=True) if w]
        assert llama3_tokenizer.decode(trained) == f"{messages[-1]['content']}<|eot_id|>"
        prompt = documented_format(messages[:-1], generation=True)
        assert renderer.build_generation_prompt(messages[:-1]).to_ints() == llama3_tokenizer.encode(
            prompt, add_special_tokens=False
        )
