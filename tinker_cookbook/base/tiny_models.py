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


def tiny_qwen3_config() -> PretrainedConfig:
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, **_SMALL_DIMS, **_QWEN3_IDS)


def tiny_llama3_config() -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, **_SMALL_DIMS, **_LLAMA3_IDS)


def tiny_smollm2_config() -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **_SMALL_DIMS, **_SMOLLM2_IDS)


def tiny_qwen3_vl_config() -> PretrainedConfig:
    from transformers import Qwen3VLConfig

    # mrope_section splits head_dim/2 = 8 rotary frequencies over (time, height, width).
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    text_config = dict(vocab_size=151936, rope_scaling=rope, **_SMALL_DIMS, **_QWEN3_IDS)
    vision_config = dict(
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
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )


TINY_MODEL_CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "tinker-cookbook/tiny-qwen3": tiny_qwen3_config,
    "tinker-cookbook/tiny-llama3": tiny_llama3_config,
    "tinker-cookbook/tiny-smollm2": tiny_smollm2_config,
    "tinker-cookbook/tiny-qwen3-vl": tiny_qwen3_vl_config,
}
"""Name -> a fresh config of that tiny model."""
