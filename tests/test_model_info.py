"""Model attributes and recommended renderers for the Tinker lineup, the local families and the tiny models."""

from __future__ import annotations

import pytest

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.model_info import (
    get_model_attributes,
    get_recommended_renderer_name,
    get_recommended_renderer_names,
    warn_if_renderer_not_recommended,
)

# The docs' "Available Models in Tinker" table: name -> (training type, architecture, renderer).
LINEUP = {
    "Qwen/Qwen3-VL-235B-A22B-Instruct": ("vision", "moe", "qwen3_vl_instruct"),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ("vision", "moe", "qwen3_vl_instruct"),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("instruction", "moe", "qwen3_instruct"),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": ("instruction", "moe", "qwen3_instruct"),
    "Qwen/Qwen3-30B-A3B": ("hybrid", "moe", "qwen3"),
    "Qwen/Qwen3-30B-A3B-Base": ("base", "moe", "role_colon"),
    "Qwen/Qwen3-32B": ("hybrid", "dense", "qwen3"),
    "Qwen/Qwen3-8B": ("hybrid", "dense", "qwen3"),
    "Qwen/Qwen3-8B-Base": ("base", "dense", "role_colon"),
    "Qwen/Qwen3-4B-Instruct-2507": ("instruction", "dense", "qwen3_instruct"),
    "openai/gpt-oss-120b": ("reasoning", "moe", "gpt_oss_no_sysprompt"),
    "openai/gpt-oss-20b": ("reasoning", "moe", "gpt_oss_no_sysprompt"),
    "deepseek-ai/DeepSeek-V3.1": ("hybrid", "moe", "deepseekv3"),
    "deepseek-ai/DeepSeek-V3.1-Base": ("base", "moe", "role_colon"),
    "meta-llama/Llama-3.1-70B": ("base", "dense", "role_colon"),
    "meta-llama/Llama-3.3-70B-Instruct": ("instruction", "dense", "llama3"),
    "meta-llama/Llama-3.1-8B": ("base", "dense", "role_colon"),
    "meta-llama/Llama-3.1-8B-Instruct": ("instruction", "dense", "llama3"),
    "meta-llama/Llama-3.2-3B": ("base", "dense", "role_colon"),
    "meta-llama/Llama-3.2-1B": ("base", "dense", "role_colon"),
    "moonshotai/Kimi-K2-Thinking": ("reasoning", "moe", "kimi_k2"),
}


@pytest.mark.parametrize("name", sorted(LINEUP))
def test_docs_lineup(name: str) -> None:
    training_type, _architecture, renderer = LINEUP[name]
    attrs = get_model_attributes(name)
    assert (attrs.training_type, attrs.architecture, attrs.recommended_renderer) == LINEUP[name]
    assert attrs.is_chat == (training_type != "base")
    assert attrs.is_vl == (training_type == "vision")
    assert get_recommended_renderer_name(name) == renderer


def test_attribute_fields() -> None:
    attrs = get_model_attributes("Qwen/Qwen3-30B-A3B:peft:123")
    assert (attrs.organization, attrs.version, attrs.size, attrs.is_chat) == ("Qwen", "3", "30B-A3B", True)
    assert get_recommended_renderer_names("Qwen/Qwen3-30B-A3B") == ["qwen3", "qwen3_disable_thinking"]
    llama = get_model_attributes("meta-llama/Llama-3.2-1B-Instruct")
    assert (llama.organization, llama.version_str, llama.size_str, llama.recommended_renderer) == (
        "meta-llama",
        "3.2",
        "1B",
        "llama3",
    )


@pytest.mark.parametrize(
    ("name", "renderers", "is_vl"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", ["chatml"], False),
        ("HuggingFaceTB/SmolLM2-135M", ["role_colon"], False),
        ("Qwen/Qwen3-0.6B", ["qwen3", "qwen3_disable_thinking"], False),
        ("Qwen/Qwen3-VL-8B-Thinking", ["qwen3_vl"], True),
        ("tinker-cookbook/tiny-qwen3", ["qwen3", "qwen3_disable_thinking"], False),
        ("tinker-cookbook/tiny-llama3", ["llama3"], False),
        ("tinker-cookbook/tiny-smollm2", ["chatml"], False),
        ("tinker-cookbook/tiny-qwen3-vl", ["qwen3_vl", "qwen3_vl_instruct"], True),
        ("tinker-cookbook/tiny-qwen3-vl-moe", ["qwen3_vl_instruct", "qwen3_vl"], True),
    ],
)
def test_local_families_and_tiny_models(name: str, renderers: list[str], is_vl: bool) -> None:
    attrs = get_model_attributes(name)
    assert get_recommended_renderer_names(name) == renderers
    assert attrs.is_vl is is_vl
    assert attrs.is_test_model == name.startswith("tinker-cookbook/")


def test_unknown_model_lists_known_families() -> None:
    with pytest.raises(
        ConfigurationError, match=r"unknown model 'acme/Foo-7B'.*Qwen/Qwen3-\*.*meta-llama/Llama-3"
    ):
        get_model_attributes("acme/Foo-7B")
    with pytest.raises(ConfigurationError, match="tinker-cookbook/tiny-qwen3"):
        get_recommended_renderer_name("Qwen/Qwen2.5-7B")
    # Only what loads end to end is offered as known, mixture-of-experts models (vision-language too) included.
    with pytest.raises(ConfigurationError) as info:
        get_model_attributes("acme/Foo-7B")
    offered = str(info.value)
    assert "A3B" in offered and "tiny-qwen3-moe" in offered and "tiny-qwen3-vl-moe" in offered
    assert "Qwen/Qwen3-VL-* (dense, and mixture-of-experts" in offered


def test_warn_if_renderer_not_recommended(caplog: pytest.LogCaptureFixture) -> None:
    assert warn_if_renderer_not_recommended("Qwen/Qwen3-8B", "llama3") is True
    assert "not recommended for Qwen/Qwen3-8B" in caplog.text
    assert warn_if_renderer_not_recommended("Qwen/Qwen3-8B", "qwen3_disable_thinking") is False
