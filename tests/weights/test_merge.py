"""``build_hf_model``: the merged folder loads in transformers and computes what the engine samples from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.weights.conftest import QWEN3, QWEN3_VL, SMOLLM2
from tinker_cookbook import tinker, weights
from tinker_cookbook.tinker import types

TOKENS = [5, 17, 100, 2000, 31, 7, 901, 44, 12, 3000, 250, 77]
# Both sides run fp32 over the same weights (the engine applies scale·B·A as its own merged matmul or as a separate
# LoRA path; transformers uses W + scale·B·A): they differ only by rounding order. A logprob is
# logit - logsumexp(logits); each logit is a 64-term dot product through 2 layers (relative error ~ a few ·64·u,
# u = 6e-8, on logits of magnitude < 10: ~1e-5), and logsumexp over the 151936-entry vocabulary adds ~log2(V)·u
# relative. 1e-4 covers that with a margin while still catching a missing or mis-scaled LoRA term, which moves
# logprobs by > 1e-2 after the training steps of the fixture.
LOGPROB_TOLERANCE = 1e-4


def engine_logprobs(tinker_path: str) -> np.ndarray:
    client = tinker.ServiceClient().create_sampling_client(model_path=tinker_path)
    values = client.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    return np.array(values[1:], dtype=np.float64)


def transformers_logprobs(folder: str) -> np.ndarray:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = "vision_config" in json.loads(Path(folder, "config.json").read_text())
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(TOKENS[1:])[:, None])[:, 0]
    return logprobs.double().numpy()


def base_logprobs(base_model: str) -> np.ndarray:
    client = tinker.ServiceClient().create_sampling_client(base_model=base_model)
    return np.array(client.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()[1:], dtype=np.float64)


@pytest.mark.parametrize(("base_model", "fixture"), [(QWEN3, "qwen3_checkpoint"), (SMOLLM2, "smollm2_checkpoint"),
                                                     (QWEN3_VL, "qwen3_vl_checkpoint")])
def test_merged_logits_equal_the_engine_on_the_adapter(base_model, fixture, request, tmp_path: Path):
    checkpoint = request.getfixturevalue(fixture)
    out = weights.build_hf_model(adapter_path=checkpoint, output_path=str(tmp_path / "merged"), dtype="float32")
    merged, engine = transformers_logprobs(out), engine_logprobs(checkpoint)
    assert np.abs(merged - engine).max() < LOGPROB_TOLERANCE
    # the adapter changed the model, so the check above is not passed by the base alone
    assert np.abs(engine - base_logprobs(base_model)).max() > 100 * LOGPROB_TOLERANCE
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    if base_model == SMOLLM2:  # an unembedding LoRA on tied embeddings: lm_head gets its own weight
        assert config["tie_word_embeddings"] is False


def test_sharded_output_and_bf16(qwen3_checkpoint, tmp_path: Path):
    out = Path(weights.build_hf_model(adapter_path=qwen3_checkpoint, output_path=str(tmp_path / "m"), dtype="bf16",
                                      max_shard_bytes=10**7))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).is_file() for s in shards)
    assert not list(out.glob("*.tmp"))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    from tinker_cookbook.weights._base import BaseFiles

    assert {t.dtype for _, t in BaseFiles("m", out).tensors()} == {torch.bfloat16}
    card = (out / "README.md").read_text()
    assert qwen3_checkpoint in card and "base_model: tinker-cookbook/tiny-qwen3" in card
