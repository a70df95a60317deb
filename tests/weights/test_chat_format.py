"""Each renderer's chat template (the tokenizer of exported models, GGUF metadata) renders exactly its tokens."""

from __future__ import annotations

import pytest

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.weights._chat_format import CHAT_FORMATS, chat_format

MODELS = {"llama3": "tinker-cookbook/tiny-llama3", "role_colon": "tinker-cookbook/tiny-llama3",
          "chatml": "tinker-cookbook/tiny-smollm2"}
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name a colour.\n"}],
    [{"role": "user", "content": "ünïcödé ✓ 你好"}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "  spaces  "}],
]


@pytest.mark.parametrize("name", [n for n in CHAT_FORMATS if not n.startswith("qwen3_vl")])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_template_tokens_equal_the_renderers(name: str, conversation: list[renderers.Message]):
    tokenizer = get_tokenizer(MODELS.get(name, "tinker-cookbook/tiny-qwen3"))
    renderer = renderers.get_renderer(name, tokenizer)
    want = renderer.build_generation_prompt(conversation).to_ints()
    text = tokenizer.apply_chat_template(conversation, chat_template=chat_format(name).jinja(),
                                         add_generation_prompt=True, tokenize=False)
    assert text == tokenizer.decode(want)
    # The renderer encodes each message's content on its own, so content with leading or trailing spaces may
    # split into other tokens than the whole text does; elsewhere the tokens are the same too.
    if all(m["content"] == m["content"].strip() for m in conversation):
        assert tokenizer.encode(text, add_special_tokens=False) == want


def test_unknown_renderer_is_refused():
    with pytest.raises(ConfigurationError, match="renderer_name='nope'.*known: chatml"):
        chat_format("nope")
