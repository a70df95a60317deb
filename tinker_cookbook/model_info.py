"""What we know about each model: family, size, chat or base, vision, architecture, and the renderer to use.

``get_model_attributes(name)`` covers the Tinker model lineup (the docs' "Available Models"), any Qwen3 /
Qwen3-VL / Llama-3 name (read from the name's conventions: ``-Base``, ``-Instruct``, ``-Instruct-2507``,
``-A3B`` for mixture-of-experts), SmolLM2, and the tiny random test models ``tinker-cookbook/tiny-*``.
An unknown name raises ``ConfigurationError`` listing the known families.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.tokenizer_utils import strip_model_suffix

TrainingType = Literal["base", "instruction", "hybrid", "reasoning", "vision"]
Architecture = Literal["dense", "moe"]


@dataclass(frozen=True)
class ModelAttributes:
    organization: str
    """The Hub organization, e.g. ``"Qwen"``."""
    version_str: str
    """The family version, e.g. ``"3"``, ``"3.1"``."""
    size_str: str
    """The size as written in the name, e.g. ``"8B"``, ``"30B-A3B"``, ``"135M"``."""
    is_chat: bool
    """Post-trained for chat (False for base models, which get the ``role_colon`` renderer)."""
    recommended_renderers: tuple[str, ...]
    """Renderer names that fit the model, best first."""
    is_vl: bool = False
    architecture: Architecture = "dense"
    training_type: TrainingType = "base"
    is_test_model: bool = False
    """A tiny random model built from a config, for tests only."""

    @property
    def recommended_renderer(self) -> str:
        return self.recommended_renderers[0]

    @property
    def version(self) -> str:
        return self.version_str

    @property
    def size(self) -> str:
        return self.size_str


def _attrs(
    org: str,
    version: str,
    size: str,
    training_type: TrainingType,
    renderers: tuple[str, ...],
    *,
    is_vl: bool = False,
    is_test_model: bool = False,
    architecture: Architecture | None = None,
) -> ModelAttributes:
    return ModelAttributes(
        organization=org,
        version_str=version,
        size_str=size,
        is_chat=training_type != "base",
        recommended_renderers=renderers,
        is_vl=is_vl,
        architecture=architecture or ("moe" if re.search(r"-A\d+B\Z", size) else "dense"),
        training_type=training_type,
        is_test_model=is_test_model,
    )


# Models outside the Qwen3 / Llama-3 / SmolLM2 rules: the docs' lineup and the tiny test models. The renderers
# named for gpt-oss (harmony), DeepSeek and Kimi are the cookbook's names for their formats.
_GPT_OSS = ("gpt_oss_no_sysprompt", "gpt_oss_medium_reasoning")
_EXPLICIT: dict[str, ModelAttributes] = {
    "openai/gpt-oss-120b": _attrs("openai", "oss", "120B", "reasoning", _GPT_OSS, architecture="moe"),
    "openai/gpt-oss-20b": _attrs("openai", "oss", "20B", "reasoning", _GPT_OSS, architecture="moe"),
    "deepseek-ai/DeepSeek-V3.1": _attrs(
        "deepseek-ai", "3.1", "671B-A37B", "hybrid", ("deepseekv3", "deepseekv3_thinking")
    ),
    "deepseek-ai/DeepSeek-V3.1-Base": _attrs("deepseek-ai", "3.1", "671B-A37B", "base", ("role_colon",)),
    "moonshotai/Kimi-K2-Thinking": _attrs("moonshotai", "K2", "1T-A32B", "reasoning", ("kimi_k2",)),
    "tinker-cookbook/tiny-qwen3": _attrs(
        "tinker-cookbook", "3", "tiny", "hybrid", ("qwen3", "qwen3_disable_thinking"), is_test_model=True
    ),
    "tinker-cookbook/tiny-llama3": _attrs(
        "tinker-cookbook", "3", "tiny", "instruction", ("llama3",), is_test_model=True
    ),
    "tinker-cookbook/tiny-smollm2": _attrs(
        "tinker-cookbook", "2", "tiny", "instruction", ("chatml",), is_test_model=True
    ),
    # The tiny mixture-of-experts models all borrow Qwen3's tokenizer, hence Qwen3's renderers.
    **{
        name: _attrs("tinker-cookbook", "3", "tiny", "hybrid", ("qwen3", "qwen3_disable_thinking"),
                     is_test_model=True, architecture="moe")
        for name in ("tinker-cookbook/tiny-qwen3-moe", "tinker-cookbook/tiny-gpt-oss", "tinker-cookbook/tiny-deepseek-v3")
    },
    "tinker-cookbook/tiny-qwen3-vl": _attrs(
        "tinker-cookbook",
        "3",
        "tiny",
        "vision",
        ("qwen3_vl", "qwen3_vl_instruct"),
        is_vl=True,
        is_test_model=True,
    ),
    "tinker-cookbook/tiny-qwen3-vl-moe": _attrs(
        "tinker-cookbook", "3", "tiny", "vision", ("qwen3_vl_instruct", "qwen3_vl"), is_vl=True, is_test_model=True,
        architecture="moe",
    ),
}

_QWEN3 = re.compile(r"^Qwen/Qwen3-(?P<vl>VL-)?(?P<size>\d+(\.\d+)?B(-A\d+B)?)(?P<variant>-.*)?\Z")
_LLAMA3 = re.compile(r"^meta-llama/(Meta-)?Llama-(?P<version>3(\.\d)?)-(?P<size>\d+B)(?P<variant>-.*)?\Z")
_SMOLLM2 = re.compile(r"^HuggingFaceTB/SmolLM2-(?P<size>\d+(\.\d+)?[MB])(?P<variant>-.*)?\Z")

# What the unknown-model error offers: the families that load and train end to end here. gpt-oss, DeepSeek-V3.1 and
# Kimi-K2 run on the engine's general path and have renderers too, but their tokenizers do not ship offline.
KNOWN_FAMILIES = (
    "Qwen/Qwen3-* (dense, and mixture-of-experts -A3B/-A22B; hybrid, -Base, -Instruct-2507, -Thinking-2507)",
    "Qwen/Qwen3-VL-* (dense, and mixture-of-experts -A3B/-A22B; -Instruct, -Thinking)",
    "meta-llama/Llama-3.x-* (base and -Instruct)",
    "HuggingFaceTB/SmolLM2-* (base and -Instruct)",
    *sorted(name for name, attrs in _EXPLICIT.items() if attrs.is_test_model),
)


def _qwen3(match: re.Match[str]) -> ModelAttributes:
    size, variant = match["size"], match["variant"] or ""
    if match["vl"]:
        if variant.startswith("-Instruct"):
            return _attrs("Qwen", "3", size, "vision", ("qwen3_vl_instruct",), is_vl=True)
        return _attrs("Qwen", "3", size, "vision", ("qwen3_vl",), is_vl=True)
    if variant == "-Base":
        return _attrs("Qwen", "3", size, "base", ("role_colon",))
    if variant.startswith("-Instruct"):
        return _attrs("Qwen", "3", size, "instruction", ("qwen3_instruct",))
    if variant.startswith("-Thinking"):
        return _attrs("Qwen", "3", size, "reasoning", ("qwen3",))
    return _attrs("Qwen", "3", size, "hybrid", ("qwen3", "qwen3_disable_thinking"))


def _llama3(match: re.Match[str]) -> ModelAttributes:
    if (match["variant"] or "").startswith("-Instruct"):
        return _attrs("meta-llama", match["version"], match["size"], "instruction", ("llama3",))
    return _attrs("meta-llama", match["version"], match["size"], "base", ("role_colon",))


def _smollm2(match: re.Match[str]) -> ModelAttributes:
    if (match["variant"] or "").startswith("-Instruct"):
        return _attrs("HuggingFaceTB", "2", match["size"], "instruction", ("chatml",))
    return _attrs("HuggingFaceTB", "2", match["size"], "base", ("role_colon",))


def get_model_attributes(model_name: str) -> ModelAttributes:
    """Attributes of ``model_name`` (a ``:suffix`` is ignored); ``ConfigurationError`` for unknown models."""
    name = strip_model_suffix(model_name.strip())
    if name in _EXPLICIT:
        return _EXPLICIT[name]
    for pattern, build in ((_QWEN3, _qwen3), (_LLAMA3, _llama3), (_SMOLLM2, _smollm2)):
        match = pattern.match(name)
        if match:
            return build(match)
    raise ConfigurationError(
        f"unknown model {model_name!r}: no attributes or recommended renderer. Known and loadable here: "
        f"{', '.join(KNOWN_FAMILIES)}. "
        "Pick one of these, or pass renderer_name explicitly where the recipe asks for it."
    )


def get_recommended_renderer_names(model_name: str) -> list[str]:
    """Renderer names that fit ``model_name``, best first."""
    return list(get_model_attributes(model_name).recommended_renderers)


def get_recommended_renderer_name(model_name: str) -> str:
    """The renderer to use for ``model_name`` by default."""
    return get_model_attributes(model_name).recommended_renderer


def warn_if_renderer_not_recommended(model_name: str, renderer_name: str) -> bool:
    """Log a warning (and return True) when ``renderer_name`` is not among ``model_name``'s recommended ones."""
    import logging

    try:
        recommended = get_recommended_renderer_names(model_name)
    except ConfigurationError:
        return False
    if renderer_name in recommended:
        return False
    logging.getLogger(__name__).warning(
        "renderer %r is not recommended for %s (recommended: %s); the model may see an unfamiliar format",
        renderer_name,
        model_name,
        recommended,
    )
    return True
