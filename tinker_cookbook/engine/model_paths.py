"""Which path a base model takes through the engine: a fast fused path, or the general transformers path.

The fast paths (``training.fused_layers`` / ``frozen_linear`` for training, ``sampling.decoder_model`` for sampling)
reimplement dense Llama-3, Qwen2/Qwen3 and Qwen3-VL. Every other causal LM that transformers implements, mixture-of-
experts models included, and Qwen3-VL-MoE with its images, runs on the general path: training through the
transformers model's own modules with peft LoRA (``training.general``), sampling through a KV-cached forward of the
same model (``sampling.general``).
``$TINKER_COOKBOOK_MODEL_PATH=general`` puts every text model on the general path.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from tinker_cookbook.engine import settings
from tinker_cookbook.tinker.errors import UnprocessableEntityError

FAST_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_vl", "qwen3_vl_text")
"""The HF ``model_type`` values of the fast paths (the sampler's compact decoder implements exactly these)."""
VISION_MODEL_TYPES = ("qwen3_vl",)
"""Vision-language models of the fast path: they always take it (its sampler feeds their vision tower's features
into the compact decoder)."""
GENERAL_VISION_MODEL_TYPES = ("qwen3_vl_moe",)
"""Vision-language models of the general path, images included (``engine.vision``). Not in transformers' causal-LM
table: their head class is image-text-to-text."""
TESTED_GENERAL_MODEL_TYPES = ("qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_vl_moe")
"""General-path families checked end to end by the tests (tiny random models), besides the dense fast ones."""
# Causal-LM heads that transform the logits after the output projection: the general path computes logprobs from
# the output projection alone (in chunks, as training does), so these would be silently wrong.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")

_announced: set[str] = set()
_announce_lock = threading.Lock()


def causal_lm_types() -> frozenset[str]:
    """Every ``model_type`` transformers maps to a causal-LM head class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def runs(model_type: str) -> bool:
    """Whether the engine runs ``model_type`` end to end (a fast path, or the general path)."""
    return model_type in FAST_MODEL_TYPES or model_type in GENERAL_VISION_MODEL_TYPES or model_type in causal_lm_types()


def is_general(config: Any) -> bool:
    """Whether a model of this HF config takes the general path (``$TINKER_COOKBOOK_MODEL_PATH`` decides for the
    dense text models of the fast paths)."""
    model_type = str(config.model_type)
    if model_type in VISION_MODEL_TYPES:
        return False
    return settings.model_path() == "general" or model_type not in FAST_MODEL_TYPES


def check_general(name: str, config: Any) -> None:
    """Refuse, naming the field, a model whose logits the general path would get wrong."""
    text_config = getattr(config, "text_config", None) or config
    for field in _LOGIT_TRANSFORMS:
        value = getattr(text_config, field, None)
        if value not in (None, 1, 1.0):
            raise UnprocessableEntityError(
                f"base_model={name!r} (model_type={config.model_type!r}) sets {field}={value!r}: its head transforms "
                "the logits after the output projection, which the engine's general path does not reproduce; "
                "choose another model"
            )


def announce(name: str, config: Any) -> None:
    """One line on stderr, once per model and process, when ``name`` takes the general path."""
    with _announce_lock:
        if name in _announced:
            return
        _announced.add(name)
    why = ("$TINKER_COOKBOOK_MODEL_PATH=general" if config.model_type in FAST_MODEL_TYPES
           else "no fast path for this architecture")
    print(f"tinker_cookbook: {name} (model_type={config.model_type}) runs on the general transformers path ({why})",
          file=sys.stderr)
