"""The name -> factory registry, and every built-in renderer on the tokenizer of its family."""

from __future__ import annotations

import pytest

from tinker_cookbook import model_info, renderers
from tinker_cookbook.renderers import (
    BUILTIN_RENDERERS,
    ChatMLRenderer,
    Renderer,
    RoleColonRenderer,
    get_registered_renderer_names,
    get_renderer,
    is_renderer_registered,
    register_renderer,
    unregister_renderer,
)
from tinker_cookbook.tokenizer_utils import Tokenizer

TOKENIZER_FOR = {
    "role_colon": "qwen3",
    "llama3": "llama3",
    "qwen3": "qwen3",
    "qwen3_disable_thinking": "qwen3",
    "qwen3_instruct": "qwen3",
    "qwen3_vl": "qwen3",
    "qwen3_vl_instruct": "qwen3",
    "chatml": "smollm2",
    "chatml_tools": "smollm2",
    "gpt_oss_no_sysprompt": "harmony",
    "gpt_oss_low_reasoning": "harmony",
    "gpt_oss_medium_reasoning": "harmony",
    "gpt_oss_high_reasoning": "harmony",
    "deepseekv3": "deepseek",
    "deepseekv3_disable_thinking": "deepseek",
    "deepseekv3_thinking": "deepseek",
    "kimi_k2": "kimi",
}


def test_builtin_names() -> None:
    assert sorted(BUILTIN_RENDERERS) == sorted(TOKENIZER_FOR)
    assert get_registered_renderer_names() == sorted(TOKENIZER_FOR)


@pytest.mark.parametrize("name", sorted(TOKENIZER_FOR))
def test_every_builtin_renders_a_conversation(request: pytest.FixtureRequest, name: str) -> None:
    tokenizer = request.getfixturevalue(f"{TOKENIZER_FOR[name]}_tokenizer")
    renderer = get_renderer(name, tokenizer)
    assert isinstance(renderer, Renderer)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "2+2?"}])
    assert "2+2?" in tokenizer.decode(prompt.to_ints())
    assert renderer.get_stop_sequences()


def test_custom_renderer_registration(qwen3_tokenizer: Tokenizer) -> None:
    def factory(tokenizer: Tokenizer, image_processor: object) -> Renderer:
        return ChatMLRenderer(tokenizer, default_system_prompt="Custom.")

    register_renderer("my_chatml", factory)
    try:
        assert is_renderer_registered("my_chatml") and "my_chatml" in get_registered_renderer_names()
        renderer = get_renderer("my_chatml", qwen3_tokenizer)
        assert isinstance(renderer, ChatMLRenderer) and renderer.default_system_prompt == "Custom."
        # A custom factory wins over a built-in of the same name.
        register_renderer("qwen3", lambda tok, _: RoleColonRenderer(tok))
        assert isinstance(get_renderer("qwen3", qwen3_tokenizer), RoleColonRenderer)
    finally:
        unregister_renderer("my_chatml")
        unregister_renderer("qwen3")
    assert not is_renderer_registered("my_chatml")
    assert type(get_renderer("qwen3", qwen3_tokenizer)).__name__ == "Qwen3Renderer"
    with pytest.raises(KeyError, match="no custom renderer registered under 'my_chatml'"):
        unregister_renderer("my_chatml")


def test_recommended_renderers_exist_for_local_families() -> None:
    for name in [
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-8B-Base",
        "Qwen/Qwen3-4B-Instruct-2507",
        "Qwen/Qwen3-VL-30B-A3B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.2-1B",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "tinker-cookbook/tiny-qwen3",
        "tinker-cookbook/tiny-llama3",
        "tinker-cookbook/tiny-smollm2",
        "tinker-cookbook/tiny-qwen3-vl",
    ]:
        for renderer_name in model_info.get_recommended_renderer_names(name):
            assert renderers.is_renderer_registered(renderer_name), (name, renderer_name)


def test_vision_renderer_gets_processor_from_model_name(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3_vl", qwen3_tokenizer, model_name="Qwen/Qwen3-VL-235B-A22B-Instruct")
    assert renderer.image_processor.patch_size == 16  # type: ignore[attr-defined]
