"""Tokenizers by model name, online or offline.

``get_tokenizer(name)`` resolves a name in this order:

1. a tokenizer registered with ``register_tokenizer`` (custom or test tokenizers);
2. the Hugging Face cache, then the Hub (the Hub only when it is reachable and ``HF_HUB_OFFLINE`` is not set,
   so that a machine without network fails over in well under a second instead of retrying for a minute);
3. the exact tokenizers that registry packages ship (see ``tinker_cookbook.base.assets``): Qwen3 / Qwen3-VL,
   Llama-3, and SmolLM2 (read from its GGUF file once, then cached as a plain tokenizer directory);
4. a ``ConfigurationError`` naming the model, what was tried, and how to make it available.

Results are cached per name, so every caller shares one tokenizer object per model.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from transformers import PreTrainedTokenizerBase

from tinker_cookbook.base import assets
from tinker_cookbook.base.atomic_files import atomic_dir
from tinker_cookbook.base.hub import hub_is_reachable
from tinker_cookbook.exceptions import ConfigurationError

logger = logging.getLogger(__name__)

Tokenizer: TypeAlias = PreTrainedTokenizerBase
"""A Hugging Face tokenizer (fast or slow); everything here only needs its ``PreTrainedTokenizerBase`` API."""

TokenizerFactory: TypeAlias = Callable[[], Tokenizer]

SMOLLM2_TOKENIZER_CACHE_NAME = "SmolLM2-135M-Instruct"
TINY_MODEL_PREFIX = "tinker-cookbook/tiny-"

_custom_tokenizers: dict[str, TokenizerFactory] = {}
_custom_instances: dict[str, Tokenizer] = {}


# ---------------------------------------------------------------------------------------------------------
# Custom registry
# ---------------------------------------------------------------------------------------------------------


def register_tokenizer(name: str, factory: TokenizerFactory) -> None:
    """Make ``get_tokenizer(name)`` return ``factory()`` (called once, on first use); overrides every other source."""
    _custom_tokenizers[name] = factory
    _custom_instances.pop(name, None)


def unregister_tokenizer(name: str) -> None:
    """Remove a tokenizer added with ``register_tokenizer``; unknown names raise ``KeyError``."""
    if name not in _custom_tokenizers:
        raise KeyError(
            f"no tokenizer registered under {name!r}; registered: {get_registered_tokenizer_names()}"
        )
    del _custom_tokenizers[name]
    _custom_instances.pop(name, None)


def is_tokenizer_registered(name: str) -> bool:
    return name in _custom_tokenizers


def get_registered_tokenizer_names() -> list[str]:
    return sorted(_custom_tokenizers)


# ---------------------------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------------------------


def strip_model_suffix(model_name: str) -> str:
    """``"Qwen/Qwen3-8B:peft:1234"`` -> ``"Qwen/Qwen3-8B"`` (Tinker model names may carry a ``:suffix``)."""
    return model_name.split(":", 1)[0]


def get_tokenizer(model_name: str) -> Tokenizer:
    """The tokenizer of ``model_name`` (a Hub name such as ``"Qwen/Qwen3-8B"``); see the module docstring."""
    if not isinstance(model_name, str) or not model_name.strip():
        raise ConfigurationError(f"model_name must be a non-empty string, got {model_name!r}")
    name = strip_model_suffix(model_name.strip())
    if name in _custom_tokenizers:
        if name not in _custom_instances:
            _custom_instances[name] = _custom_tokenizers[name]()
        return _custom_instances[name]
    return _load_tokenizer(name)


@functools.cache
def _load_tokenizer(name: str) -> Tokenizer:
    tried: list[str] = []
    # The tiny test models exist only here (built from a config), so the Hub has nothing for them.
    if not name.startswith(TINY_MODEL_PREFIX):
        tokenizer = _from_huggingface(name, tried)
        if tokenizer is not None:
            return tokenizer
    family = packaged_tokenizer_family(name)
    if family is not None:
        return _PACKAGED_LOADERS[family]()
    tried.append("packaged offline tokenizers: none covers this name")
    raise ConfigurationError(
        f"no tokenizer found for model {name!r}. Tried: {'; '.join(tried)}. "
        "Fix: use a model of a supported family (Qwen/Qwen3-*, Qwen/Qwen3-VL-*, meta-llama/Llama-3*, "
        "HuggingFaceTB/SmolLM2-*, tinker-cookbook/tiny-*), make it available in the Hugging Face cache "
        "(e.g. `huggingface-cli download MODEL` on a machine with network), or call "
        "tokenizer_utils.register_tokenizer(name, factory)."
    )


def _from_huggingface(name: str, tried: list[str]) -> Tokenizer | None:
    """The tokenizer from the local HF cache, else from the Hub when reachable; None (and notes in ``tried``) if neither."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as e:
        tried.append(f"Hugging Face cache: {type(e).__name__}")
    if not hub_is_reachable():
        tried.append("Hugging Face Hub: skipped (offline mode is on, e.g. HF_HUB_OFFLINE=1, or the Hub is unreachable)")
        return None
    try:
        return AutoTokenizer.from_pretrained(name)
    # Gated, missing, unsupported by this transformers, or a network error: the packaged copy may still serve.
    except (OSError, ValueError, KeyError, ImportError) as e:
        tried.append(f"Hugging Face Hub: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        logger.info("Hub tokenizer for %s unavailable (%s); trying packaged tokenizers", name, e)
        return None


# ---------------------------------------------------------------------------------------------------------
# Packaged offline tokenizers
# ---------------------------------------------------------------------------------------------------------

# Name patterns of each family whose exact tokenizer ships in a registry package. Qwen3.5 and later use another
# vocabulary, hence ``Qwen3-`` (with the hyphen) rather than any ``Qwen3`` prefix. The tiny gpt-oss and DeepSeek-V3
# models borrow Qwen3's (no tokenizer of theirs ships offline).
_FAMILY_PATTERNS: dict[str, re.Pattern[str]] = {
    "qwen3": re.compile(r"^(Qwen/Qwen3-|Qwen/Qwen3\Z|tinker-cookbook/tiny-(qwen3(-vl|-moe|-vl-moe)?|gpt-oss|deepseek-v3)\Z)"),
    "llama3": re.compile(r"^(meta-llama/(Meta-)?Llama-3([.-]|\Z)|tinker-cookbook/tiny-llama3\Z)"),
    "smollm2": re.compile(r"^(HuggingFaceTB/SmolLM2-|tinker-cookbook/tiny-smollm2\Z)"),
}


def packaged_tokenizer_family(model_name: str) -> str | None:
    """Which packaged tokenizer (``"qwen3"``, ``"llama3"``, ``"smollm2"``) serves ``model_name``, if any."""
    name = strip_model_suffix(model_name)
    for family, pattern in _FAMILY_PATTERNS.items():
        if pattern.match(name):
            return family
    return None


@functools.cache
def _packaged_qwen3() -> Tokenizer:
    from transformers import AutoTokenizer

    path = assets.require(assets.qwen3_tokenizer_dir(), "the Qwen3 tokenizer")
    return AutoTokenizer.from_pretrained(str(path))


@functools.cache
def _packaged_llama3() -> Tokenizer:
    from transformers import AutoTokenizer

    path = assets.require(assets.llama3_tokenizer_dir(), "the Llama-3 tokenizer")
    return AutoTokenizer.from_pretrained(str(path))


@functools.cache
def _packaged_smollm2() -> Tokenizer:
    from transformers import AutoTokenizer

    cached = smollm2_tokenizer_cache_dir()
    if not (cached / "tokenizer_config.json").exists():
        gguf = assets.require(assets.smollm2_gguf(), "the SmolLM2-135M-Instruct GGUF")
        save_tokenizer_atomically(_tokenizer_from_gguf(gguf), cached)
    return AutoTokenizer.from_pretrained(str(cached))


def smollm2_tokenizer_cache_dir() -> Path:
    """Where the tokenizer read from SmolLM2's GGUF is saved (reading the GGUF takes seconds; the copy loads fast)."""
    return assets.cache_dir() / "tokenizers" / SMOLLM2_TOKENIZER_CACHE_NAME


def _tokenizer_from_gguf(gguf: Path) -> Tokenizer:
    from transformers import AutoTokenizer

    logger.info("reading the SmolLM2 tokenizer from %s (once; cached afterwards)", gguf)
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def save_tokenizer_atomically(tokenizer: Tokenizer, target: Path) -> None:
    """Save ``tokenizer`` to ``target`` so that readers see either nothing or a complete directory.

    Written to a temporary sibling and renamed (``atomic_dir``); if another process won the race, its copy is kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(target, is_complete=lambda d: (d / "tokenizer_config.json").exists()) as staging:
        tokenizer.save_pretrained(str(staging))


_PACKAGED_LOADERS: dict[str, Callable[[], Tokenizer]] = {
    "qwen3": _packaged_qwen3,
    "llama3": _packaged_llama3,
    "smollm2": _packaged_smollm2,
}
