"""Tiny random models (real vocabularies, so the real tokenizers apply) and the HF references and sampling
helpers that the sampler's tests share."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaForCausalLM, Qwen3ForCausalLM

from tinker_cookbook.base.tiny_models import tiny_llama3_config, tiny_qwen3_config
from tinker_cookbook.engine.sampling import decode as sampler_decode
from tinker_cookbook.engine.sampling import decoder_model as sampler_model
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.tinker import types

# Large init so that the tiny models' distributions are peaked enough for argmax/top-k comparisons to be stable.
INIT = 0.3


def tiny_qwen3(**overrides: Any) -> Qwen3ForCausalLM:
    """tiny-qwen3 (2 layers, q/k norms, grouped K/V, Qwen3's vocabulary) at the large init, seed 0; ``overrides``
    its config."""
    torch.manual_seed(0)
    return Qwen3ForCausalLM(tiny_qwen3_config(initializer_range=INIT, **overrides)).eval()


def tiny_llama() -> LlamaForCausalLM:
    """tiny-llama3 with llama3 RoPE scaling and tied embeddings at the large init, seed 1."""
    torch.manual_seed(1)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = tiny_llama3_config(tie_word_embeddings=True, rope_parameters=rope, max_position_embeddings=256,
                                initializer_range=INIT)
    return LlamaForCausalLM(config).eval()


def tiny_qwen2() -> torch.nn.Module:
    """A 2-layer Qwen2 with Qwen2's vocabulary and random (non-zero) q/k/v biases, seed 3."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=INIT,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # q/k/v biases start at zero: make them count
        for name, parameter in model.named_parameters():
            if name.endswith("proj.bias"):
                parameter.normal_(0.0, 0.5)
    return model


def sampling_weights(
    model: torch.nn.Module, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> SamplingWeights:
    """The sampler's weights of ``model`` (no adapter) in ``dtype``, on ``device``."""
    state = {k: v.to(device) for k, v in model.state_dict().items()}
    return SamplingWeights.build(model.config, state, None, None, dtype)


def text_prompt(tokenizer: Any, text: str) -> types.ModelInput:
    """``text`` encoded by ``tokenizer`` as a prompt."""
    return types.ModelInput.from_ints(tokenizer.encode(text))


def hf_logprobs(model: torch.nn.Module, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Log-softmax of the model's (temperature-scaled) logits at every position of ``tokens``."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def hf_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """The ``steps`` tokens greedy decoding by full HF forwards appends to ``prompt``."""
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(hf_logprobs(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def sample(
    engine: SamplerEngine,
    weights: SamplingWeights,
    tokenizer: Any,
    prompt: types.ModelInput,
    num_samples: int = 1,
    **params: Any,
) -> types.SampleResponse:
    """One request's response from ``engine``; ``params`` are the ``SamplingParams``."""
    future = engine.submit(weights, tokenizer, prompt, num_samples, types.SamplingParams(**params))
    return future.result(timeout=60)


PROMPTS = [[5, 17, 300, 9, 44, 1000, 7], [12, 8, 100, 2000], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
"""Three prompts of lengths 7, 4 and 11."""


def stored_prompts(
    weights: sampler_model.DecoderWeights, of_row: list[int]
) -> tuple[list[torch.Tensor], sampler_decode.SharedPrompts]:
    """``PROMPTS``' K/V (prefilled) and a prompt pool holding each once, continued by decode rows ``of_row``."""
    spec = weights.spec
    kvs = sampler_model.prefill(weights, PROMPTS, torch.float32).kv
    cache = torch.zeros(spec.num_layers, 2, len(PROMPTS), spec.num_kv_heads, 16, spec.head_dim)
    for slot, kv in enumerate(kvs):
        cache[:, :, slot, :, : kv.shape[3]] = kv
    lengths = torch.tensor([len(p) for p in PROMPTS])
    return kvs, sampler_decode.SharedPrompts(cache, lengths, torch.tensor(of_row))
