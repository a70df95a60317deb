"""get_tokenizer: packaged offline tokenizers by family, the custom registry, caching, and clear errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tinker_cookbook.base import assets, hub
from tinker_cookbook.base import tokenizers as tokenizer_utils
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.tokenizer_utils import (
    get_registered_tokenizer_names,
    get_tokenizer,
    is_tokenizer_registered,
    packaged_tokenizer_family,
    register_tokenizer,
    unregister_tokenizer,
)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Qwen/Qwen3-8B", "qwen3"),
        ("Qwen/Qwen3-30B-A3B-Base", "qwen3"),
        ("Qwen/Qwen3-4B-Instruct-2507", "qwen3"),
        ("Qwen/Qwen3-VL-235B-A22B-Instruct", "qwen3"),
        ("Qwen/Qwen3-8B:peft:abc", "qwen3"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3"),
        ("meta-llama/Llama-3.2-1B", "llama3"),
        ("meta-llama/Meta-Llama-3-8B", "llama3"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
        ("HuggingFaceTB/SmolLM2-1.7B", "smollm2"),
        ("tinker-cookbook/tiny-qwen3", "qwen3"),
        ("tinker-cookbook/tiny-qwen3-vl", "qwen3"),
        ("tinker-cookbook/tiny-llama3", "llama3"),
        ("tinker-cookbook/tiny-smollm2", "smollm2"),
        ("Qwen/Qwen3.5-9B", None),  # another vocabulary: must not get the Qwen3 tokenizer
        ("meta-llama/Llama-2-7b-hf", None),
        ("openai/gpt-oss-20b", None),
    ],
)
def test_packaged_family(name: str, family: str | None) -> None:
    assert packaged_tokenizer_family(name) == family


def test_special_token_ids_of_packaged_tokenizers() -> None:
    qwen = get_tokenizer("Qwen/Qwen3-8B")
    assert len(qwen) == 151669
    assert qwen.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<think>"]) == [
        151644,
        151645,
        151655,
        151667,
    ]
    llama = get_tokenizer("meta-llama/Llama-3.1-8B-Instruct")
    assert llama.convert_tokens_to_ids(["<|begin_of_text|>", "<|eot_id|>"]) == [128000, 128009]
    assert llama.encode("hi")[0] == 128000  # Llama's encode adds BOS
    smol = get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert len(smol) == 49152
    assert smol.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert "SmolLM" in (smol.chat_template or "")


def test_same_object_per_family_and_suffix_stripped() -> None:
    assert get_tokenizer("Qwen/Qwen3-8B") is get_tokenizer("Qwen/Qwen3-8B:any-suffix")
    assert get_tokenizer("tinker-cookbook/tiny-qwen3") is get_tokenizer("Qwen/Qwen3-32B")
    assert get_tokenizer("tinker-cookbook/tiny-smollm2") is get_tokenizer(
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_smollm2_tokenizer_is_cached_as_a_directory() -> None:
    get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")
    cached = tokenizer_utils.smollm2_tokenizer_cache_dir()
    assert cached == assets.cache_dir() / "tokenizers" / "SmolLM2-135M-Instruct"
    assert (cached / "tokenizer_config.json").exists() and (cached / "tokenizer.json").exists()


def test_save_tokenizer_atomically(tmp_path: Path) -> None:
    tokenizer = get_tokenizer("meta-llama/Llama-3.2-1B")
    target = tmp_path / "tok"
    tokenizer_utils.save_tokenizer_atomically(tokenizer, target)
    tokenizer_utils.save_tokenizer_atomically(tokenizer, target)  # second writer: keeps the first copy
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no staging directories left behind

    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(target)).encode("Hello world") == tokenizer.encode("Hello world")


def test_registry_overrides_and_unregisters() -> None:
    llama = get_tokenizer("meta-llama/Llama-3.2-1B")
    calls: list[int] = []

    def factory():
        calls.append(1)
        return llama

    register_tokenizer("Qwen/Qwen3-8B", factory)
    try:
        assert is_tokenizer_registered("Qwen/Qwen3-8B")
        assert "Qwen/Qwen3-8B" in get_registered_tokenizer_names()
        assert get_tokenizer("Qwen/Qwen3-8B:x") is llama and get_tokenizer("Qwen/Qwen3-8B") is llama
        assert calls == [1]  # the factory runs once
    finally:
        unregister_tokenizer("Qwen/Qwen3-8B")
    assert not is_tokenizer_registered("Qwen/Qwen3-8B")
    assert len(get_tokenizer("Qwen/Qwen3-8B")) == 151669
    with pytest.raises(KeyError, match="no tokenizer registered under 'Qwen/Qwen3-8B'"):
        unregister_tokenizer("Qwen/Qwen3-8B")


def test_unknown_model_fails_fast_with_a_clear_error() -> None:
    assert not tokenizer_utils.hub_is_reachable()  # tests run with HF_HUB_OFFLINE=1
    start = time.monotonic()
    with pytest.raises(ConfigurationError) as excinfo:
        get_tokenizer("acme/unknown-model-7B")
    assert time.monotonic() - start < 5
    message = str(excinfo.value)
    assert "acme/unknown-model-7B" in message
    assert "Hugging Face cache" in message and "skipped" in message and "register_tokenizer" in message
    with pytest.raises(ConfigurationError, match="non-empty string"):
        get_tokenizer("  ")


def test_offline_env_disables_the_hub_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub must not be contacted when HF_HUB_OFFLINE=1")

    monkeypatch.setattr(hub, "_answers", no_network)
    assert tokenizer_utils.hub_is_reachable() is False
