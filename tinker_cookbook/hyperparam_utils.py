"""Hyperparameter heuristics: the recommended learning rate and LoRA parameter counts.

Recommended LoRA learning rate (the documentation's formula, "Supervised Learning Hyperparameters")::

    LR(m) = 5e-5 * M_LoRA * (2000 / H_m) ** P_m        M_LoRA = 10 (1 for full fine-tuning)

with ``H_m`` the model's hidden size and ``P_m`` = 0.781 for Llama-architecture models (Llama, SmolLM2) and
0.0775 for Qwen models. ``get_lr("meta-llama/Llama-3.1-8B")`` = 2.856e-4.

Model dimensions come from a built-in table of well-known hub models (so no network is needed), then from the
engine's model registry (tiny test models, SmolLM2, anything in the local Hugging Face cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tinker_cookbook.exceptions import ConfigurationError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

LR_BASE = 5e-5
LORA_LR_MULTIPLIER = 10.0
Family = Literal["llama", "qwen"]
LR_EXPONENTS: dict[Family, float] = {"llama": 0.781, "qwen": 0.0775}


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a decoder-only transformer that LoRA sizes and LR heuristics depend on."""

    family: Family
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 0
    """0 for dense models; for mixture-of-experts models ``intermediate_size`` is the per-expert size."""


def _dims(family: Family, h: int, i: int, layers: int, heads: int, kv: int, hd: int, vocab: int,
          experts: int = 0) -> ModelDims:
    return ModelDims(family, h, i, layers, heads, kv, hd, vocab, experts)


_LLAMA3_VOCAB = 128256
_QWEN3_VOCAB = 151936
# Published configs of models users name most often; everything else is read from a config file.
_KNOWN_DIMS: dict[str, ModelDims] = {
    "meta-llama/Llama-3.2-1B": _dims("llama", 2048, 8192, 16, 32, 8, 64, _LLAMA3_VOCAB),
    "meta-llama/Llama-3.2-3B": _dims("llama", 3072, 8192, 28, 24, 8, 128, _LLAMA3_VOCAB),
    "meta-llama/Llama-3.1-8B": _dims("llama", 4096, 14336, 32, 32, 8, 128, _LLAMA3_VOCAB),
    "meta-llama/Llama-3.1-70B": _dims("llama", 8192, 28672, 80, 64, 8, 128, _LLAMA3_VOCAB),
    "meta-llama/Llama-3.3-70B-Instruct": _dims("llama", 8192, 28672, 80, 64, 8, 128, _LLAMA3_VOCAB),
    "Qwen/Qwen3-0.6B": _dims("qwen", 1024, 3072, 28, 16, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-1.7B": _dims("qwen", 2048, 6144, 28, 16, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-4B": _dims("qwen", 2560, 9728, 36, 32, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-4B-Instruct-2507": _dims("qwen", 2560, 9728, 36, 32, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-8B": _dims("qwen", 4096, 12288, 36, 32, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-14B": _dims("qwen", 5120, 17408, 40, 40, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-32B": _dims("qwen", 5120, 25600, 64, 64, 8, 128, _QWEN3_VOCAB),
    "Qwen/Qwen3-30B-A3B": _dims("qwen", 2048, 768, 48, 32, 4, 128, _QWEN3_VOCAB, experts=128),
    "HuggingFaceTB/SmolLM2-135M-Instruct": _dims("llama", 576, 1536, 30, 9, 3, 64, 49152),
}
# Variants share their base model's shape.
for _base, _variants in {
    "meta-llama/Llama-3.2-1B": ["meta-llama/Llama-3.2-1B-Instruct"],
    "meta-llama/Llama-3.2-3B": ["meta-llama/Llama-3.2-3B-Instruct"],
    "meta-llama/Llama-3.1-8B": ["meta-llama/Llama-3.1-8B-Instruct"],
    "meta-llama/Llama-3.1-70B": ["meta-llama/Llama-3.1-70B-Instruct"],
    "Qwen/Qwen3-4B": ["Qwen/Qwen3-4B-Base"],
    "Qwen/Qwen3-8B": ["Qwen/Qwen3-8B-Base"],
    "Qwen/Qwen3-14B": ["Qwen/Qwen3-14B-Base"],
    # Qwen3-VL-30B-A3B's language model has Qwen3-30B-A3B's shape (LoRA adapts the language model only).
    "Qwen/Qwen3-30B-A3B": ["Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B-Instruct-2507",
                           "Qwen/Qwen3-VL-30B-A3B-Instruct"],
    "HuggingFaceTB/SmolLM2-135M-Instruct": ["HuggingFaceTB/SmolLM2-135M"],
}.items():
    for _variant in _variants:
        _KNOWN_DIMS[_variant] = _KNOWN_DIMS[_base]

_MODEL_TYPE_FAMILIES: dict[str, Family] = {
    "llama": "llama", "qwen2": "qwen", "qwen3": "qwen", "qwen3_moe": "qwen", "qwen3_vl": "qwen",
    "qwen3_vl_text": "qwen", "qwen3_vl_moe": "qwen", "qwen3_vl_moe_text": "qwen",
}


def _strip(model_name: str) -> str:
    # "org/model:variant" names a fine-tuned variant of the same shape.
    return model_name.split(":", 1)[0]


def _load_config(model_name: str) -> PretrainedConfig:
    """A model's config: the tiny test models', else Hugging Face's (local cache first, the Hub where reachable)."""
    from transformers import AutoConfig

    from tinker_cookbook.base.hub import hub_is_reachable
    from tinker_cookbook.base.tiny_models import TINY_MODEL_CONFIGS

    if model_name in TINY_MODEL_CONFIGS:
        return TINY_MODEL_CONFIGS[model_name]()
    return AutoConfig.from_pretrained(model_name, local_files_only=not hub_is_reachable())


def _dims_from_config(model_name: str) -> ModelDims:
    """Dimensions read from the model's config (tiny test models, the local HF cache, the Hub)."""
    try:
        config = _load_config(model_name)
    except (OSError, ValueError) as exc:  # transformers' "not found / not cached / not a config" errors
        raise ConfigurationError(
            f"model_name={model_name!r}: its config is not available here, so its dimensions are not known "
            f"({type(exc).__name__}). Use one of {dense_known_models()}, a model whose config is in the local "
            "Hugging Face cache, or pass learning_rate explicitly"
        ) from exc
    text = getattr(config, "text_config", None) or config
    model_type = getattr(text, "model_type", "")
    family = _MODEL_TYPE_FAMILIES.get(model_type)
    if family is None:
        raise ConfigurationError(
            f"model_name={model_name!r} has model_type={model_type!r}; the LR heuristics know only Llama and Qwen "
            f"architectures ({sorted(_MODEL_TYPE_FAMILIES)}); pass learning_rate explicitly"
        )
    heads = int(text.num_attention_heads)
    experts = int(getattr(text, "num_experts", 0) or 0)
    return ModelDims(
        family=family,
        hidden_size=int(text.hidden_size),
        intermediate_size=int(getattr(text, "moe_intermediate_size", 0) if experts else text.intermediate_size),
        num_hidden_layers=int(text.num_hidden_layers),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
        vocab_size=int(text.vocab_size),
        num_experts=experts,
    )


def dense_known_models() -> list[str]:
    """The built-in table's dense models (the ones a learning-rate error suggests: every family's formula there has
    its exponent)."""
    return sorted(name for name, dims in _KNOWN_DIMS.items() if dims.num_experts == 0)


def get_model_dims(model_name: str) -> ModelDims:
    """The dimensions of ``model_name`` (built-in table first, then the model's config; no network)."""
    name = _strip(model_name)
    if name in _KNOWN_DIMS:
        return _KNOWN_DIMS[name]
    return _dims_from_config(name)


def get_lora_lr_over_full_finetune_lr(model_name: str, lora_alpha: int = 32) -> float:
    """How much larger the best LoRA learning rate is than the best full fine-tuning one: 10, for every model
    and rank (LoRA's ``alpha / rank`` scaling makes the optimum independent of the rank)."""
    return LORA_LR_MULTIPLIER


def get_lr(model_name: str, is_lora: bool = True) -> float:
    """The recommended learning rate: ``5e-5 * (10 if LoRA) * (2000 / hidden_size) ** exponent(family)``."""
    dims = get_model_dims(model_name)
    multiplier = get_lora_lr_over_full_finetune_lr(model_name) if is_lora else 1.0
    return LR_BASE * multiplier * (2000 / dims.hidden_size) ** LR_EXPONENTS[dims.family]


def _lora_pair(rank: int, fan_in: int, fan_out: int) -> int:
    # A LoRA on a (fan_in -> fan_out) linear adds A: fan_in x r and B: r x fan_out.
    return rank * (fan_in + fan_out)


def get_lora_param_count(
    model_name: str,
    lora_rank: int = 32,
    train_mlp: bool = True,
    train_attn: bool = True,
    train_unembed: bool = True,
) -> int:
    """Trainable LoRA parameters on the engine's targets: q/k/v/o (attn), gate/up/down (mlp), lm_head (unembed).

    For mixture-of-experts layers each expert has its own factor on the expert side while the factor on the
    hidden side is shared, i.e. ``r * (H + E * I)`` per projection: Tinker's count, which the official cookbook
    reports. The local engine's expert adapters are peft's, one pair per expert (``docs/models.md``), so its MoE
    adapters hold more parameters than this count.
    """
    if lora_rank <= 0:
        raise ConfigurationError(f"lora_rank={lora_rank} must be positive")
    d = get_model_dims(model_name)
    h, r = d.hidden_size, lora_rank
    per_layer = 0
    if train_attn:
        q_out, kv_out = d.num_attention_heads * d.head_dim, d.num_key_value_heads * d.head_dim
        per_layer += _lora_pair(r, h, q_out) + 2 * _lora_pair(r, h, kv_out) + _lora_pair(r, q_out, h)
    if train_mlp:
        expert_side = d.intermediate_size * max(d.num_experts, 1)
        per_layer += 3 * _lora_pair(r, h, expert_side)
    total = per_layer * d.num_hidden_layers
    if train_unembed:
        total += _lora_pair(r, h, d.vocab_size)
    return total


def get_lora_lr_multiplier(model_name: str) -> float:
    """The model-dependent factor of the recommended LoRA learning rate, ``get_lr / 5e-5``."""
    return get_lr(model_name) / LR_BASE

