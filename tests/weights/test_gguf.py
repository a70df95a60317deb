"""``export_gguf``: the file reads back with the gguf reader (tensors, tokenizer, chat template) and converts back
to the merged weights within the rounding of its type."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tinker_cookbook import weights
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.weights._base import BaseFiles
from tinker_cookbook.weights._chat_format import chat_format


@pytest.fixture(scope="module")
def merged(smollm2_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "merged"
    weights.build_hf_model(adapter_path=smollm2_checkpoint, output_path=str(out), dtype="float32")
    return out


def merged_tensors(folder: Path) -> dict[str, torch.Tensor]:
    return dict(BaseFiles(str(folder), folder).tensors())


def test_f16_round_trip_and_metadata(merged: Path, tmp_path: Path):
    path = weights.export_gguf(str(merged), str(tmp_path / "model.gguf"), quant="f16", ollama=True)
    metadata, tensors = weights.read_gguf(path)
    expected = merged_tensors(merged)
    assert set(tensors) == set(expected)  # every tensor, the untied lm_head included
    for key, value in expected.items():
        # f16 keeps 11 significant bits: converting back gives exactly the f16 rounding of each weight
        # (1-D tensors stay f32 and come back exact).
        want = value if value.dim() == 1 else value.to(torch.float16).float()
        assert torch.equal(tensors[key], want), key
    assert metadata["general.architecture"] == "llama"
    assert metadata["tokenizer.ggml.model"] == "gpt2"
    assert metadata["tokenizer.chat_template"] == chat_format("chatml").jinja()
    assert metadata["tokenizer.ggml.eos_token_id"] == 2
    modelfile = (tmp_path / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./model.gguf") and 'PARAMETER stop "<|im_end|>"' in modelfile
    assert "<|im_start|>assistant" in modelfile


def test_q8_0_within_block_rounding(merged: Path, tmp_path: Path):
    path = weights.export_gguf(str(merged), str(tmp_path / "model.gguf"), quant="q8_0")
    _, tensors = weights.read_gguf(path)
    for key, value in merged_tensors(merged).items():
        if value.dim() == 1:
            assert torch.equal(tensors[key], value)
            continue
        # q8_0: blocks of 32 along a row, x ≈ d·q with d = max|x|/127 (stored in f16) and q a rounded int8:
        # |error| ≤ d/2 from rounding q, plus ≤ 127·|d|·2^-11 from d's f16 rounding: under d per block.
        blocks = value.reshape(-1, 32)
        d = blocks.abs().amax(dim=1, keepdim=True) / 127
        assert ((tensors[key].reshape(-1, 32) - blocks).abs() <= d * 1.01 + 1e-12).all(), key


def test_bad_quant_and_existing_file(merged: Path, tmp_path: Path):
    with pytest.raises(ConfigurationError, match="quant='q4_k' is not offered.*f16"):
        weights.export_gguf(str(merged), str(tmp_path / "m.gguf"), quant="q4_k")
    (tmp_path / "m.gguf").write_text("old")
    with pytest.raises(ConfigurationError, match="already exists"):
        weights.export_gguf(str(merged), str(tmp_path / "m.gguf"))
    assert (tmp_path / "m.gguf").read_text() == "old"


@pytest.fixture(scope="module")
def merged_qwen3(qwen3_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "merged-qwen3"
    weights.build_hf_model(adapter_path=qwen3_checkpoint, output_path=str(out), dtype="float32")
    return out


@pytest.mark.parametrize("fixture", ["merged", "merged_qwen3"])
def test_transformers_reads_the_file_as_the_same_model(fixture: str, request, tmp_path: Path):
    """transformers' own GGUF loader (an independent inverse of the naming, the rotary permutation of ``llama``
    and the tokenizer metadata) gives the merged model's logits and tokens. About 10 s each: it converts the whole
    vocabulary back into a tokenizer, the only check of the file that does not use this project's reader."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    merged = request.getfixturevalue(fixture)
    weights.export_gguf(str(merged), str(tmp_path / "model.gguf"), quant="f32")
    tokens = [5, 17, 100, 2000, 31, 7, 901]
    # transformers' GGUF reader takes Qwen3's head_dim from its default (128) rather than from the file's
    # attention.key_length (16 in the tiny model; 128 in the real ones), so the tiny Qwen3 gets its config given.
    config = {"config": AutoConfig.from_pretrained(str(merged))} if fixture == "merged_qwen3" else {}
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf", dtype=torch.float32,
                                                  **config)
    reference = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
    with torch.no_grad():
        got, want = (m(torch.tensor([tokens])).logits for m in (loaded, reference))
    assert torch.allclose(got, want, atol=1e-5, rtol=0)  # the same fp32 weights and the same computation
    text = "<|im_start|>user\nHello there, how are you?<|im_end|>"
    gguf_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="model.gguf")
    assert gguf_tokenizer.encode(text) == AutoTokenizer.from_pretrained(str(merged)).encode(text)
