"""Trained sampler checkpoints on the tiny random models, shared by the weights tests."""

from __future__ import annotations

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.checkpoint_utils import renderer_user_metadata
from tinker_cookbook.tinker import types

QWEN3 = "tinker-cookbook/tiny-qwen3"
SMOLLM2 = "tinker-cookbook/tiny-smollm2"  # tied embeddings: an unembedding LoRA must untie them
QWEN3_VL = "tinker-cookbook/tiny-qwen3-vl"  # the language model is merged, the vision tower copied


@pytest.fixture(autouse=True)
def fp32_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine samples in fp32, so that its logprobs compare with transformers' fp32 forward."""
    monkeypatch.setenv("TINKER_COOKBOOK_SAMPLER_DTYPE", "fp32")


def train_and_save(base_model: str, renderer_name: str, train_unembed: bool = True) -> str:
    """A sampler checkpoint after a few large steps (LoRA B starts at zero: the adapter must have moved)."""
    service = tinker.ServiceClient()
    tc = service.create_lora_training_client(base_model, rank=4, seed=1, train_unembed=train_unembed,
                                             user_metadata=renderer_user_metadata(renderer_name))
    tokens = list(range(100, 132))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=5e-2))
    return tc.save_weights_for_sampler("final").result().path


@pytest.fixture(scope="session")
def qwen3_checkpoint() -> str:
    return train_and_save(QWEN3, "qwen3")


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> str:
    return train_and_save(SMOLLM2, "chatml")


@pytest.fixture(scope="session")
def qwen3_vl_checkpoint() -> str:
    return train_and_save(QWEN3_VL, "qwen3_vl")
