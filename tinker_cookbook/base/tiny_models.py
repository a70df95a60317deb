"""Configs of the tiny random-init test models (``tinker-cookbook/tiny-*``).

They live in the bottom layer because both the engine (which builds the models) and the cookbook (which sizes
LoRA and learning rates from a model's dimensions) need the same shapes; weights are the engine's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PretrainedConfig

TINY_CONTEXT_LENGTH = 2048

_SMALL_DIMS: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=TINY_CONTEXT_LENGTH,
)
# Special-token ids of the real models whose tokenizers the tiny models borrow.
_QWEN3_IDS: dict[str, Any] = dict(bos_token_id=151643, eos_token_id=151645)
_LLAMA3_IDS: dict[str, Any] = dict(bos_token_id=128000, eos_token_id=128001)
_SMOLLM2_IDS: dict[str, Any] = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)


def tiny_qwen3_config(**overrides: Any) -> PretrainedConfig:
    """tiny-qwen3's config; ``overrides`` replace its fields (tests vary the init scale, tying, RoPE)."""
    from transformers import Qwen3Config

    return Qwen3Config(**{"vocab_size": 151936, **_SMALL_DIMS, **_QWEN3_IDS, **overrides})


def tiny_llama3_config(**overrides: Any) -> PretrainedConfig:
    """tiny-llama3's config; ``overrides`` replace its fields."""
    from transformers import LlamaConfig

    return LlamaConfig(**{"vocab_size": 128256, **_SMALL_DIMS, **_LLAMA3_IDS, **overrides})


def tiny_smollm2_config() -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **_SMALL_DIMS, **_SMOLLM2_IDS)


# mrope_section splits head_dim/2 = 8 rotary frequencies over (time, height, width).
_MROPE: dict[str, Any] = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
_VISION_DIMS: dict[str, Any] = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=_SMALL_DIMS["hidden_size"],
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    deepstack_visual_indexes=[0, 1],
)


def tiny_qwen3_vl_config() -> PretrainedConfig:
    from transformers import Qwen3VLConfig

    text_config = dict(vocab_size=151936, rope_scaling=dict(_MROPE), **_SMALL_DIMS, **_QWEN3_IDS)
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=dict(_VISION_DIMS),
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )


# Mixture-of-experts: 8 experts, 2 per token, small expert width; layer 0 dense where the family has dense layers.
_MOE_DIMS: dict[str, Any] = dict(num_experts_per_tok=2, moe_intermediate_size=32)


def tiny_qwen3_moe_config() -> PretrainedConfig:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=151936, num_experts=8, norm_topk_prob=True, **_MOE_DIMS, **_SMALL_DIMS,
                          **_QWEN3_IDS)


def tiny_gpt_oss_config() -> PretrainedConfig:
    from transformers import GptOssConfig

    # Attention sinks and alternating sliding-window / full layers as gpt-oss; a window of 8 tokens so that test
    # prompts run past it. No gpt-oss tokenizer is packaged: it borrows Qwen3's (vocabulary and ids).
    # YaRN as gpt-oss, scaled so that 64 * 32 is the tiny context length.
    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": TINY_CONTEXT_LENGTH // 32}
    dims = {**_SMALL_DIMS, "intermediate_size": _MOE_DIMS["moe_intermediate_size"]}
    return GptOssConfig(vocab_size=151936, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"], rope_parameters=rope, **dims,
                        **_QWEN3_IDS)


def tiny_deepseek_v3_config() -> PretrainedConfig:
    from transformers import DeepseekV3Config

    # Multi-head latent attention (low-rank q and kv with a decoupled rotary part), one shared expert, grouped
    # routing (2 groups, 1 chosen), the first layer dense. Borrows Qwen3's tokenizer (none packaged for DeepSeek).
    dims = {k: v for k, v in _SMALL_DIMS.items() if k != "head_dim"}
    return DeepseekV3Config(
        vocab_size=151936, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
        q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **_MOE_DIMS, **dims, **_QWEN3_IDS,
    )


def tiny_qwen3_vl_moe_config() -> PretrainedConfig:
    from transformers import Qwen3VLMoeConfig

    # tiny-qwen3-vl's vision tower, token ids and multimodal rope, with Qwen3-MoE's routed experts in every text
    # layer; the output projection untied, as in Qwen3-VL-30B-A3B.
    dense = tiny_qwen3_vl_config()
    text_config = dict(vocab_size=151936, rope_scaling=dict(_MROPE), num_experts=8, norm_topk_prob=True,
                       tie_word_embeddings=False, **_MOE_DIMS, **_SMALL_DIMS, **_QWEN3_IDS)
    return Qwen3VLMoeConfig(
        text_config=text_config,
        vision_config=dict(_VISION_DIMS),
        image_token_id=dense.image_token_id,
        video_token_id=dense.video_token_id,
        vision_start_token_id=dense.vision_start_token_id,
        vision_end_token_id=dense.vision_end_token_id,
        tie_word_embeddings=False,
    )


TINY_MODEL_CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "tinker-cookbook/tiny-qwen3": tiny_qwen3_config,
    "tinker-cookbook/tiny-llama3": tiny_llama3_config,
    "tinker-cookbook/tiny-smollm2": tiny_smollm2_config,
    "tinker-cookbook/tiny-qwen3-vl": tiny_qwen3_vl_config,
    "tinker-cookbook/tiny-qwen3-moe": tiny_qwen3_moe_config,
    "tinker-cookbook/tiny-gpt-oss": tiny_gpt_oss_config,
    "tinker-cookbook/tiny-deepseek-v3": tiny_deepseek_v3_config,
    "tinker-cookbook/tiny-qwen3-vl-moe": tiny_qwen3_vl_moe_config,
}
"""Name -> a fresh config of that tiny model."""
