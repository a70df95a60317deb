"""The format decisions of the Qwen3 family, checked against the Qwen3 chat template that ships offline.

- A prefilled empty ``<think>`` block is prompt, not trained: ``qwen3_disable_thinking``'s generation prompt ends
  with it (the template's ``enable_thinking=False``), so the model never samples it. With thinking on
  (``qwen3``) the prompt does not prefill it and the model samples the (empty) block itself, so it is trained.
- ``qwen3_vl`` / ``qwen3_vl_instruct`` format text exactly like ``qwen3`` / ``qwen3_instruct`` (no Qwen3-VL
  template is available offline; the official cookbook uses the Qwen3 formats for them too).
- ``qwen3_instruct`` drops reasoning in history (as the template does for turns before the last query) and
  refuses to train a reply with reasoning (an Instruct-2507 model never emits ``<think>``).
"""

from __future__ import annotations

import random

import pytest
from random_conversations import random_conversation

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers import Message, get_renderer
from tinker_cookbook.tokenizer_utils import Tokenizer


def _trained_text(tokenizer: Tokenizer, renderer_name: str, messages: list[Message]) -> tuple[str, list[int]]:
    renderer = get_renderer(renderer_name, tokenizer)
    model_input, weights = renderer.build_supervised_example(messages)
    tokens = model_input.to_ints()
    trained = [t for t, w in zip(tokens, weights.tolist(), strict=True) if w > 0]
    return tokenizer.decode(trained), tokens


def _template(tokenizer: Tokenizer, messages: list[Message], **kwargs: object) -> list[int]:
    text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, **kwargs)
    return tokenizer.encode(text.removesuffix("\n"), add_special_tokens=False)  # the example ends at <|im_end|>


def test_prefilled_empty_think_block_is_prompt(qwen3_tokenizer: Tokenizer) -> None:
    messages: list[Message] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]
    trained, tokens = _trained_text(qwen3_tokenizer, "qwen3_disable_thinking", messages)
    assert tokens == _template(qwen3_tokenizer, messages, enable_thinking=False)
    assert trained == "A<|im_end|>"


def test_sampled_empty_think_block_is_trained(qwen3_tokenizer: Tokenizer) -> None:
    messages: list[Message] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]
    trained, tokens = _trained_text(qwen3_tokenizer, "qwen3", messages)
    assert tokens == _template(qwen3_tokenizer, messages)
    assert trained == "<think>\n\n</think>\n\nA<|im_end|>"


@pytest.mark.parametrize(("vl", "text"), [("qwen3_vl", "qwen3"), ("qwen3_vl_instruct", "qwen3_instruct")])
def test_vl_renderers_format_text_like_qwen3(qwen3_tokenizer: Tokenizer, vl: str, text: str) -> None:
    rng = random.Random(7)
    vl_renderer, text_renderer = get_renderer(vl, qwen3_tokenizer), get_renderer(text, qwen3_tokenizer)
    compared = 0
    for _ in range(30):
        conv = random_conversation(rng)
        system: list[Message] = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        messages = system + list(conv.messages)
        cut = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1) + 1
        if cut == 0:
            continue
        assert (vl_renderer.build_generation_prompt(messages[:cut]).to_ints()
                == text_renderer.build_generation_prompt(messages[:cut]).to_ints())
        compared += 1
    assert compared > 10


def test_qwen3_instruct_reasoning(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3_instruct", qwen3_tokenizer)
    reasoned: Message = {"role": "assistant", "content": [{"type": "thinking", "thinking": "R"},
                                                          {"type": "text", "text": "A"}]}
    history: list[Message] = [{"role": "user", "content": "q"}, reasoned, {"role": "user", "content": "q2"}]
    plain = [history[0], {"role": "assistant", "content": "A"}, history[2]]
    assert renderer.build_generation_prompt(history).to_ints() == renderer.build_generation_prompt(plain).to_ints()
    with pytest.raises(RendererError, match="renders no reasoning"):
        renderer.build_supervised_example(history[:2])
