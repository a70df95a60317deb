"""Sampler decoding vs HF (compact decoder, Qwen3-VL, general path), prompt K/V sharing, LoRA merging."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sampler_models import (
    INIT,
    hf_greedy,
    sample,
    sampling_weights,
    stored_prompts,
    tiny_llama,
    tiny_qwen2,
    tiny_qwen3,
)

from tinker_cookbook.engine.sampling import adapter as sampler_adapter
from tinker_cookbook.engine.sampling import decode as sampler_decode
from tinker_cookbook.engine.sampling import decoder_model as sampler_model
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError


@pytest.mark.parametrize(
    "make", [tiny_qwen3, tiny_llama, tiny_qwen2], ids=["qwen3", "llama3-rope-tied", "qwen2-qkv-bias"]
)
def test_decoder_matches_hf_logits(make: Any) -> None:
    model = make()
    weights = sampling_weights(model).decoder
    prompts = [[5, 17, 300, 9, 44, 1000, 7], [12, 8, 100, 2000]]
    result = sampler_model.prefill(weights, prompts, torch.float32)
    spec = weights.spec
    cache = torch.zeros(spec.num_layers, 2, 2, spec.num_kv_heads, 16, spec.head_dim)
    for slot, kv in enumerate(result.kv):
        cache[:, :, slot, :, : kv.shape[3]] = kv
    step = sampler_model.logits(
        weights, sampler_decode.decode(weights, cache, torch.tensor([3, 4]), torch.tensor([7, 4]), 8)
    )
    for slot, (prompt, hidden) in enumerate(zip(prompts, result.hidden)):
        with torch.no_grad():
            reference = model(torch.tensor([prompt + [3 + slot]])).logits[0]
        torch.testing.assert_close(sampler_model.logits(weights, hidden), reference[:-1], atol=1e-4, rtol=0)
        torch.testing.assert_close(step[slot], reference[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("make", [tiny_qwen3, tiny_llama, tiny_qwen2], ids=["qwen3", "llama", "qwen2-qkv-bias"])
def test_prompts_with_a_shared_prefix_prefill_as_each_alone(make: Any) -> None:
    """Prompts starting with the same 20 tokens compute them once; K/V and hidden states equal each prompt's own
    prefill, and the logits match the HF forward.

    Same fp32 arithmetic per position; the prompts' own tokens attend through an explicit mask instead of
    ``is_causal`` (another SDPA code path, another summation order): a few ulp per layer (bound 1e-5 of the largest
    value), and the HF logits within the 1e-4 of ``test_decoder_matches_hf_logits``.
    """
    model = make()
    weights = sampling_weights(model).decoder
    prefix = [(7 * i + 3) % 1000 for i in range(20)]
    prompts = [prefix + [5, 17, 300], prefix + [12], prefix + [3, 1, 4, 1, 5, 9, 2, 6]]
    assert sampler_model.shared_prefix_length(prompts) == 20
    together = sampler_model.prefill(weights, prompts, torch.float32)
    for prompt, kv, hidden in zip(prompts, together.kv, together.hidden, strict=True):
        alone = sampler_model.prefill(weights, [prompt], torch.float32)
        torch.testing.assert_close(kv, alone.kv[0], atol=1e-5 * float(alone.kv[0].abs().max()), rtol=0)
        torch.testing.assert_close(hidden, alone.hidden[0], atol=1e-5 * float(alone.hidden[0].abs().max()), rtol=0)
        with torch.no_grad():
            reference = model(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(sampler_model.logits(weights, hidden), reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "of_row",
    [[2, 0, 2, 0, 2], [0, 1, 2], [0, 2]],
    ids=["interleaved-slot-1-unused", "one-row-per-prompt-in-order", "one-row-per-prompt-slot-1-unused"],
)
def test_shared_prompt_decode_equals_per_sequence_copies(qwen3: Any, of_row: list[int]) -> None:
    """Prompts stored once and read by all their samples give the decode of per-sample prompt copies.

    Rows of three prompts (lengths 7, 4, 11), over three steps: interleaved unevenly, as slot compaction leaves
    them, with prompt slot 1 unused, as after its last sample finished (rows regrouped by prompt, prompt slots
    gathered); one row per prompt in slot order, as a batch of 1 (no regrouping, prompt slots read as a slice); and
    one row per prompt with slot 1 unused (no regrouping, slots gathered). Same fp32 arithmetic except that the softmax-
    weighted sum over the prompt and the generated positions is two matmuls instead of one: fp32 summation order,
    a few ulp per operation (measured 7e-7 of the largest state after two layers); bound 1e-5 of the largest.
    """
    weights = sampling_weights(qwen3).decoder
    spec = weights.spec
    kvs, shared = stored_prompts(weights, of_row)
    lengths = shared.lengths
    copies = torch.zeros(spec.num_layers, 2, len(of_row), spec.num_kv_heads, 32, spec.head_dim)
    for row, prompt in enumerate(of_row):
        copies[:, :, row, :, : int(lengths[prompt])] = kvs[prompt]
    own = torch.zeros(spec.num_layers, 2, len(of_row), spec.num_kv_heads, 8, spec.head_dim)
    positions = lengths[of_row].clone()
    for step in range(3):
        tokens = torch.tensor([7 + 13 * row + step for row in range(len(of_row))])
        expected = sampler_decode.decode(weights, copies, tokens, positions, int(positions.max()) + 1)
        got = sampler_decode.decode(weights, own, tokens, positions, step + 1, shared)
        torch.testing.assert_close(got, expected, atol=1e-5 * float(expected.abs().max()), rtol=0)
        positions += 1


def test_samples_of_a_prompt_share_its_kv_cache(qwen3_weights: SamplingWeights, tokenizer: Any) -> None:
    """8 samples of a 300-token prompt hold at most 0.3x the K/V memory of 8 prompt copies (issue 17's bound).

    The prompt's K/V are stored once; each sample keeps its generated tokens' K/V only. The bound is on what the
    caches allocate (headroom included), against 8 copies that would fit exactly.
    """
    prompt = list(range(1000, 1300))
    samples, new_tokens = 8, 16
    with SamplerEngine() as fresh:
        response = fresh.submit(
            qwen3_weights, None, types.ModelInput.from_ints(prompt), samples,
            types.SamplingParams(max_tokens=new_tokens, seed=1),
        ).result(timeout=60)  # fmt: skip
        peak = fresh.stats().peak_kv_bytes
    assert all(len(s.tokens) == new_tokens for s in response.sequences)
    spec = qwen3_weights.decoder.spec
    per_position = spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 4  # fp32 K and V
    copies = samples * (len(prompt) + new_tokens) * per_position
    assert 0 < peak <= 0.3 * copies


def test_requests_with_the_same_prompt_share_its_kv_cache(qwen3_weights: SamplingWeights, tokenizer: Any) -> None:
    """8 requests of 1 sample each with the same 300-token prompt (an RL group: one request per env) hold at most
    0.3x the K/V memory of 8 prompt copies, like 8 samples of one request, and sample what each would alone."""
    prompt = types.ModelInput.from_ints(list(range(1000, 1300)))
    requests, new_tokens = 8, 16
    with SamplerEngine() as fresh:
        alone = [
            fresh.submit(qwen3_weights, None, prompt, 1, types.SamplingParams(max_tokens=new_tokens, seed=s))
            .result(timeout=60).sequences[0].tokens
            for s in range(2)
        ]  # fmt: skip
    with SamplerEngine() as fresh:
        # Holding the engine's lock keeps the worker from admitting until all of them are queued.
        with fresh._cond:
            futures = [
                fresh.submit(qwen3_weights, None, prompt, 1, types.SamplingParams(max_tokens=new_tokens, seed=s))
                for s in range(requests)
            ]
        together = [f.result(timeout=60).sequences[0].tokens for f in futures]
        peak = fresh.stats().peak_kv_bytes
    assert together[:2] == alone
    assert all(len(tokens) == new_tokens for tokens in together)
    spec = qwen3_weights.decoder.spec
    per_position = spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 4  # fp32 K and V
    copies = requests * (300 + new_tokens) * per_position
    assert 0 < peak <= 0.3 * copies


def test_lora_merged_into_fused_weights_equals_the_merged_parts() -> None:
    """q|k|v with LoRA deltas on q and v (not k), merged by one addmm per part straight into the fused weight,
    equals the concatenation of W + scale * (B @ A) computed part by part.

    Both are fp32 sums of the same r + 1 terms in different orders and roundings: each differs from the exact
    value by at most ~(r + 2) ulp of the terms' magnitudes, bounded here by 4 * (r + 2) * eps * (|W| + scale *
    |B| @ |A|) elementwise (eps: fp32 machine epsilon).
    """
    torch.manual_seed(0)
    rank, scale, hidden = 8, 2.0, 48
    shapes = {"q": 48, "k": 16, "v": 16}
    base = {f"l.{p}_proj.weight": torch.randn(out, hidden) for p, out in shapes.items()}
    pairs = {
        f"l.{p}_proj": {"lora_A": torch.randn(rank, hidden), "lora_B": torch.randn(shapes[p], rank)} for p in "qv"
    }
    deltas = sampler_adapter.lora_deltas(pairs, {"r": rank, "lora_alpha": rank * scale})
    reader = sampler_model._StateReader(base, deltas, torch.float32)
    fused = reader.fused([f"l.{p}_proj.weight" for p in "qkv"])
    expected, bound = [], []
    for p in "qkv":
        weight = base[f"l.{p}_proj.weight"]
        pair = pairs.get(f"l.{p}_proj")
        if pair is None:
            expected.append(weight)
            bound.append(torch.zeros_like(weight))
            continue
        expected.append(weight + (pair["lora_B"] @ pair["lora_A"]) * scale)
        magnitude = weight.abs() + scale * (pair["lora_B"].abs() @ pair["lora_A"].abs())
        bound.append(4 * (rank + 2) * torch.finfo(torch.float32).eps * magnitude)
    difference = (fused - torch.cat(expected)).abs()
    assert bool((difference <= torch.cat(bound)).all()), float((difference - torch.cat(bound)).max())
    assert reader.used == {"l.q_proj.weight", "l.v_proj.weight"}
    # k had no delta: copied exactly; the base tensors are untouched (they are shared with the trainer).
    assert torch.equal(fused[48:64], base["l.k_proj.weight"])


def test_a_lora_bias_in_the_adapter_is_refused_by_name() -> None:
    """PEFT's ``lora_bias`` saves ``lora_B.bias`` next to ``lora_B.weight``; both would land on the same factor
    (the later one silently winning), so the key is refused instead of a wrong merge."""
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    state = {f"{prefix}.lora_A.weight": torch.zeros(4, 8), f"{prefix}.lora_B.weight": torch.zeros(8, 4),
             f"{prefix}.lora_B.bias": torch.zeros(8)}
    with pytest.raises(BadRequestError, match=r"lora_B\.bias.*'bias'.*without lora_bias"):
        sampler_adapter.split_adapter_state(state)
    del state[f"{prefix}.lora_B.bias"]
    pairs, overrides = sampler_adapter.split_adapter_state(state)
    assert set(pairs["model.layers.0.self_attn.q_proj"]) == {"lora_A", "lora_B"} and not overrides


def _tiny_qwen3_vl() -> torch.nn.Module:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(2)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    text = {
        "vocab_size": 151936,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_scaling": rope,
        "initializer_range": INIT,
    }
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "deepstack_visual_indexes": [0],
    }
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )
    return Qwen3VLForConditionalGeneration(config).eval()


def test_qwen3_vl_text_prompts_sample_as_hf(engine: SamplerEngine, tokenizer: Any) -> None:
    # Image prompts: tests/engine/test_vision.py.
    model = _tiny_qwen3_vl()
    weights = sampling_weights(model)
    prompt = tokenizer.encode("<|im_start|>user\nDescribe nothing.<|im_end|>\n<|im_start|>assistant\n")
    greedy = sample(
        engine, weights, tokenizer, types.ModelInput.from_ints(prompt), max_tokens=6, temperature=0.0
    )
    assert greedy.sequences[0].tokens == hf_greedy(model, prompt, 6)


@pytest.mark.parametrize("model_type", ["gpt2", "gemma"])
def test_an_architecture_without_a_fast_path_samples_on_the_general_path(
        engine: SamplerEngine, tokenizer: Any, model_type: str) -> None:
    """GPT-2 (learned positions, a ``transformer`` decoder, tied embeddings) and Gemma (an embedding scale and norm
    offsets its initialisation computes) have no compact decoder: the sampler runs the transformers model itself,
    greedy decoding through its KV cache equals full forwards' argmax, and the base's weights stay as they were."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tinker_cookbook.engine.sampling.general import GeneralModel

    dims = {"gpt2": dict(n_layer=2, n_embd=32, n_head=2),
            "gemma": dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, pad_token_id=0)}[model_type]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, vocab_size=1000, **dims)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weights = SamplingWeights.build(model.config, model.state_dict(), None, None, torch.float32)
    assert isinstance(weights.decoder, GeneralModel)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    prompt = [5, 17, 300, 42, 7]
    greedy = sample(engine, weights, tokenizer, types.ModelInput.from_ints(prompt), max_tokens=6, temperature=0.0)
    assert greedy.sequences[0].tokens == hf_greedy(model, prompt, 6)
