"""Sampler handles: what a sampling client samples from (immutable sampling weights, the tokenizer and the base
model's name), built from a base model and an optional LoRA adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tinker_cookbook.engine.training.base_model import BaseModel
    from tinker_cookbook.engine.training.session import TrainingSession


class SamplerHandle:
    """What a sampling client samples from: immutable weights plus the tokenizer and base model name."""

    def __init__(self, base_model: str, weights: Any, tokenizer: Any, model_path: str | None) -> None:
        self.base_model = base_model
        self.weights = weights
        self.tokenizer = tokenizer
        self.model_path = model_path


def build_handle(base: BaseModel, adapter_state: dict[str, torch.Tensor] | None,
                 adapter_config: dict[str, Any] | None, model_path: str | None) -> SamplerHandle:
    """Sampling weights of ``base`` with the PEFT adapter ``adapter_state`` (None: the base alone)."""
    from tinker_cookbook.base.tokenizers import get_tokenizer
    from tinker_cookbook.engine.sampling.weights import SamplingWeights, default_sampling_dtype

    weights = SamplingWeights.build(base.config, base.base_state, adapter_state, adapter_config,
                                    default_sampling_dtype(base.device))
    return SamplerHandle(base.spec.name, weights, get_tokenizer(base.spec.tokenizer_name), model_path)


def snapshot_handle(session: TrainingSession, model_path: str | None) -> SamplerHandle:
    """Sampling weights of the session's adapter as it is now (run on the engine thread, in order)."""
    state = session.base.adapter_state(session.run_id)
    return build_handle(session.base, state, session.base.adapter_config_dict(session.run_id), model_path)
