"""A training session on a tiny random model and random rows of given lengths: what the engine's pass tests
(length groups, logprob chunks, packed rows) run, built one way."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types

TINY_MODEL = "tinker-cookbook/tiny-smollm2"


def lora_session(name: str, model: str = TINY_MODEL) -> TrainingSession:
    """A fresh fp32 session: LoRA rank 4, seed 3, the unembedding trained too."""
    base = BaseModel(get_model_spec(model), load_model(model, torch.float32), torch.float32)
    return TrainingSession(name, base, types.LoraConfig(rank=4, seed=3, train_unembed=True))


def random_datums(lengths: Sequence[int], seed: int, mean: bool = False) -> list[types.Datum]:
    """Cross-entropy datums of ``lengths`` targets each, tokens drawn from 10..999; weights 1 per token, or
    1 / (targets + 1) with ``mean``."""
    generator = torch.Generator().manual_seed(seed)
    rows = [torch.randint(10, 1000, (n + 1,), generator=generator).tolist() for n in lengths]
    return [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                        loss_fn_inputs={"target_tokens": r[1:],
                                        "weights": [1.0 / len(r) if mean else 1.0] * (len(r) - 1)})
            for r in rows]


def fp32_sampling_weights(session: TrainingSession) -> SamplingWeights:
    """The sampler's fp32 weights of ``session``'s current adapter on its base."""
    base = session.base
    return SamplingWeights.build(base.config, base.base_state, base.adapter_state(session.run_id),
                                 base.adapter_config_dict(session.run_id), torch.float32)
