"""A snapshot's sampling weights (``SamplingWeights``) and the sampler's default precision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from tinker_cookbook.engine import model_paths, settings, vision
from tinker_cookbook.engine.sampling import decoder_model, general, lora
from tinker_cookbook.engine.sampling.requests import ModelLimits
from tinker_cookbook.tinker.errors import BadRequestError

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def default_sampling_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The sampler's default precision: ``$TINKER_COOKBOOK_SAMPLER_DTYPE`` (fp32|bf16) if set, else fp32 on CPU and
    bf16 on a GPU (``device``; None means the engine's device, see ``tinker_cookbook.engine.device``).

    fp32 keeps sampler logprobs within ~1e-5 of the fp32 learner (kl_sample_train ~0), and on CPU it is faster
    than the bf16 path was before attention and the unembedding were reworked (oneDNN's packed fp32 kernels).
    bf16 is ~1.5x faster on CPUs with bf16 matrix units, but its rounded weights and activations move logprobs by
    ~0.02 on average (~0.03 on prompt tokens; SmolLM2-135M, see bench/bench_sampling.py), which the
    importance-sampling losses must then correct. On a GPU bf16 is the default: its matmuls are several times
    faster there.
    """
    value = settings.sampler_dtype()
    if value:
        if value not in _DTYPES:
            raise BadRequestError(f"${settings.SAMPLER_DTYPE_ENV}={value!r} is not a sampler dtype; use one of fp32, bf16")
        return _DTYPES[value]
    if device is None:
        from tinker_cookbook.engine.device import engine_device

        device = engine_device()
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


@dataclass(frozen=True, eq=False)
class SamplingWeights:
    """Immutable weights of one model snapshot for sampling: base + optional LoRA, merged once, or kept apart.

    Compared and hashed by identity. Snapshots with their own (merged) decoder each decode in a batch of their own;
    unmerged snapshots of one base and that base itself share its decoder and decode together (``sampling.lora``).
    """

    decoder: decoder_model.DecoderWeights | general.GeneralModel
    """The fused weights the snapshot decodes with: its merged copy, or the base shared with other snapshots; or,
    on the general path (``engine.model_paths``), the snapshot's transformers model."""

    limits: ModelLimits
    adapter: lora.Adapter | None = None
    """The unmerged LoRA applied on top of ``decoder`` (None: nothing to add)."""

    @classmethod
    def build(
        cls,
        config: transformers.PretrainedConfig,
        base_state: Mapping[str, torch.Tensor],
        adapter_state: Mapping[str, torch.Tensor] | None,
        adapter_config: Mapping[str, Any] | None,
        dtype: torch.dtype,
        lora_mode: str | None = None,
    ) -> SamplingWeights:
        """Fuse an HF state dict into sampler weights of ``dtype``, with a PEFT LoRA adapter if given.

        ``base_state`` holds plain HF keys and is only read (merged tensors are new copies). ``adapter_state`` holds
        PEFT saved-format keys; the update is ``lora_alpha / r * B @ A`` (``/ sqrt(r)`` with rsLoRA), merged into
        a copy of the weights or kept apart on the shared base: ``lora_mode`` merged | unmerged | auto (None:
        ``$TINKER_COOKBOOK_SAMPLER_LORA``, else auto), see ``sampling.lora``.
        """
        if model_paths.is_general(config):
            model = general.build_general_model(config, base_state, adapter_state, adapter_config, dtype)
            return cls(decoder=model, limits=model.limits)
        decoder: decoder_model.DecoderWeights | None = None
        adapter = None
        if lora.use_unmerged(lora.lora_mode(lora_mode), base_state, dtype):
            base = lora.shared_base(config, base_state, dtype)
            if not adapter_state:
                decoder = base
            else:
                adapter = lora.build_adapter(base, base_state, adapter_state, adapter_config)
                decoder = base if adapter is not None else None
        if decoder is None:
            decoder = decoder_model.build_decoder_weights(config, base_state, adapter_state, adapter_config, dtype)
        spec = decoder.spec
        limits = ModelLimits(
            vocab_size=spec.vocab_size,
            context_window=spec.max_positions,
            model_type=spec.model_type,
            accepts_images=spec.model_type.startswith("qwen3_vl") and spec.model_type != "qwen3_vl_text",
            vision=vision.sampler_vision(config, base_state),
        )
        return cls(decoder=decoder, limits=limits, adapter=adapter)

    @property
    def model(self) -> decoder_model.DecoderWeights:
        """The decoder with this snapshot's adapter on every row (fast path only)."""
        assert isinstance(self.decoder, decoder_model.DecoderWeights), "the general path has no compact decoder"
        return self.decoder if self.adapter is None else self.adapter.alone()

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    @property
    def vocab_size(self) -> int:
        return self.limits.vocab_size

    @property
    def context_window(self) -> int:
        return self.limits.context_window

