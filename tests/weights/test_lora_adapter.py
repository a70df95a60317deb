"""``build_lora_adapter``: a PEFT folder that loads beside the base model and computes what the engine samples."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.weights.conftest import QWEN3, train_and_save
from tests.weights.test_merge import LOGPROB_TOLERANCE, TOKENS, engine_logprobs
from tinker_cookbook import backends, weights
from tinker_cookbook.exceptions import ConfigurationError


def peft_logprobs(base_model: str, folder: str) -> np.ndarray:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(backends.base_model_dir(base_model), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, folder)
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(TOKENS[1:])[:, None])[:, 0].double().numpy()


def test_adapter_loads_in_peft_with_the_engines_logits(qwen3_checkpoint, tmp_path: Path, caplog):
    with caplog.at_level(logging.WARNING):
        out = weights.build_lora_adapter(adapter_path=qwen3_checkpoint, output_path=str(tmp_path / "adapter"))
    assert np.abs(peft_logprobs(QWEN3, out) - engine_logprobs(qwen3_checkpoint)).max() < LOGPROB_TOLERANCE
    config = json.loads(Path(out, "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == QWEN3 and config["task_type"] == "CAUSAL_LM"
    # the fixture trained the unembedding, which vLLM and SGLang cannot load: said in the log and the card
    assert "lm_head" in caplog.text and "merge" in caplog.text
    assert "vLLM and SGLang do not load" in Path(out, "README.md").read_text()
    assert Path(out, "tokenizer_config.json").is_file()


def test_adapter_without_unembedding_has_no_serving_limits(tmp_path: Path):
    checkpoint = train_and_save(QWEN3, "qwen3", train_unembed=False)
    out = weights.build_lora_adapter(adapter_path=checkpoint, output_path=str(tmp_path / "adapter"))
    assert "vLLM and SGLang" not in Path(out, "README.md").read_text()
    assert "lm_head" not in json.loads(Path(out, "adapter_config.json").read_text())["target_modules"]


def test_existing_output_is_refused_without_force(qwen3_checkpoint, tmp_path: Path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "keep").write_text("x")
    with pytest.raises(ConfigurationError, match="already exists.*--force"):
        weights.build_lora_adapter(adapter_path=qwen3_checkpoint, output_path=str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "keep").exists()
    weights.build_lora_adapter(adapter_path=qwen3_checkpoint, output_path=str(tmp_path / "adapter"), force=True)
    assert not (tmp_path / "adapter" / "keep").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temporary folder left
