"""Sampler engine: semantics against direct HF forwards on tiny random models with the real tokenizers."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from tinker_cookbook.engine.sampling import decode as sampler_decode
from tinker_cookbook.engine.sampling import decoder_model as sampler_model
from tinker_cookbook.engine.sampling import sampler as sampler_module
from tinker_cookbook.engine.sampling.batch import KVPool, RowParams, select_tokens_per_owner
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.steps import DecoderBatch
from tinker_cookbook.engine.sampling.weights import SamplingWeights, default_sampling_dtype
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, RequestFailedError, UnprocessableEntityError

# Large init so that the tiny models' distributions are peaked enough for argmax/top-k comparisons to be stable.
_INIT = 0.3


def _tiny_qwen3(**overrides: Any) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        initializer_range=_INIT,
        **overrides,
    )
    return Qwen3ForCausalLM(config).eval()


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(1)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_parameters=rope,
        max_position_embeddings=256,
        initializer_range=_INIT,
    )
    return LlamaForCausalLM(config).eval()


def _tiny_qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=_INIT,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # q/k/v biases start at zero: make them count
        for name, parameter in model.named_parameters():
            if name.endswith("proj.bias"):
                parameter.normal_(0.0, 0.5)
    return model


def _weights(model: torch.nn.Module, dtype: torch.dtype = torch.float32, device: str = "cpu") -> SamplingWeights:
    state = {k: v.to(device) for k, v in model.state_dict().items()}
    return SamplingWeights.build(model.config, state, None, None, dtype)


@pytest.fixture(scope="module")
def qwen3() -> Qwen3ForCausalLM:
    return _tiny_qwen3()


@pytest.fixture(scope="module")
def qwen3_weights(qwen3: Qwen3ForCausalLM, device: str) -> SamplingWeights:
    return _weights(qwen3, device=device)



def _prompt(tokenizer: Any, text: str) -> types.ModelInput:
    return types.ModelInput.from_ints(tokenizer.encode(text))


def _hf_logprobs(model: torch.nn.Module, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Log-softmax of the model's (temperature-scaled) logits at every position of ``tokens``."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def _hf_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(_hf_logprobs(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def _sample(
    engine: SamplerEngine,
    weights: SamplingWeights,
    tokenizer: Any,
    prompt: types.ModelInput,
    num_samples: int = 1,
    **params: Any,
) -> types.SampleResponse:
    future = engine.submit(weights, tokenizer, prompt, num_samples, types.SamplingParams(**params))
    return future.result(timeout=60)


# --------------------------------------------------------------------------------------------------------------
# The compact decoder reproduces HF
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [_tiny_qwen3, _tiny_llama, _tiny_qwen2], ids=["qwen3", "llama3-rope-tied", "qwen2-qkv-bias"]
)
def test_decoder_matches_hf_logits(make: Any) -> None:
    model = make()
    weights = _weights(model).decoder
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


@pytest.mark.parametrize("make", [_tiny_qwen3, _tiny_llama, _tiny_qwen2], ids=["qwen3", "llama", "qwen2-qkv-bias"])
def test_prompts_with_a_shared_prefix_prefill_as_each_alone(make: Any) -> None:
    """Prompts starting with the same 20 tokens compute them once; K/V and hidden states equal each prompt's own
    prefill, and the logits match the HF forward.

    Same fp32 arithmetic per position; the prompts' own tokens attend through an explicit mask instead of
    ``is_causal`` (another SDPA code path, another summation order): a few ulp per layer (bound 1e-5 of the largest
    value), and the HF logits within the 1e-4 of ``test_decoder_matches_hf_logits``.
    """
    model = make()
    weights = _weights(model).decoder
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
    weights = _weights(qwen3).decoder
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
    deltas = sampler_model.lora_deltas(pairs, {"r": rank, "lora_alpha": rank * scale})
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
        sampler_model.split_adapter_state(state)
    del state[f"{prefix}.lora_B.bias"]
    pairs, overrides = sampler_model.split_adapter_state(state)
    assert set(pairs["model.layers.0.self_attn.q_proj"]) == {"lora_A", "lora_B"} and not overrides


# --------------------------------------------------------------------------------------------------------------
# Semantics
# --------------------------------------------------------------------------------------------------------------


def test_greedy_equals_hf_argmax_while_batched(
    engine: SamplerEngine, qwen3: Any, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    """Greedy requests of different prompt and output lengths run together (slots are reused) and match HF."""
    texts = [
        "The quick brown fox",
        "Hello",
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25",
        "ok",
    ]
    lengths = [3, 45, 20, 9]
    futures = [
        engine.submit(
            qwen3_weights,
            tokenizer,
            _prompt(tokenizer, text),
            2,
            types.SamplingParams(max_tokens=n, temperature=0.0),
        )
        for text, n in zip(texts, lengths)
    ]
    for text, n, future in zip(texts, lengths, futures):
        response = future.result(timeout=60)
        expected = _hf_greedy(qwen3, tokenizer.encode(text), n)
        for sequence in response.sequences:
            assert sequence.tokens == expected
            assert sequence.stop_reason == "length"
            # Greedy logprobs are reported under the unscaled distribution.
            reference = _hf_logprobs(qwen3, tokenizer.encode(text) + expected)[
                len(tokenizer.encode(text)) - 1 : -1
            ]
            picked = reference.gather(1, torch.tensor(expected)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(sequence.logprobs), picked, atol=1e-4, rtol=0)


def test_seed_gives_same_tokens_alone_and_batched(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    prompt = _prompt(tokenizer, "Once upon a time")
    alone = _sample(engine, qwen3_weights, tokenizer, prompt, 3, max_tokens=12, seed=1234)
    others = [
        engine.submit(
            qwen3_weights,
            tokenizer,
            _prompt(tokenizer, f"other prompt {i}"),
            2,
            types.SamplingParams(max_tokens=20, seed=i),
        )
        for i in range(6)
    ]
    batched = engine.submit(
        qwen3_weights, tokenizer, prompt, 3, types.SamplingParams(max_tokens=12, seed=1234)
    )
    again = batched.result(timeout=60)
    for future in others:
        future.result(timeout=60)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in alone.sequences]
    for a, b in zip(again.sequences, alone.sequences):
        assert a.logprobs is not None and b.logprobs is not None
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    # The samples of one request differ from each other, and another seed gives other tokens.
    assert len({tuple(s.tokens) for s in alone.sequences}) == 3
    other_seed = _sample(engine, qwen3_weights, tokenizer, prompt, 3, max_tokens=12, seed=99)
    assert [s.tokens for s in other_seed.sequences] != [s.tokens for s in alone.sequences]


def test_prompt_of_several_text_chunks_equals_joined_prompt(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    first, second = tokenizer.encode("Two chunks"), tokenizer.encode(" make one prompt")
    chunked = types.ModelInput(
        chunks=[types.EncodedTextChunk(tokens=first), types.EncodedTextChunk(tokens=second)]
    )
    joined = types.ModelInput.from_ints(first + second)
    a = _sample(engine, qwen3_weights, tokenizer, chunked, 2, max_tokens=6, seed=21)
    b = _sample(engine, qwen3_weights, tokenizer, joined, 2, max_tokens=6, seed=21)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]


def test_sampled_logprobs_follow_temperature(
    engine: SamplerEngine, qwen3: Any, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    """Logprob of each sampled first token = log_softmax(z / T); pairwise differences scale as 1/T."""
    prompt_tokens = tokenizer.encode("Sampling with temperature")
    prompt = types.ModelInput.from_ints(prompt_tokens)
    with torch.no_grad():
        z = qwen3(torch.tensor([prompt_tokens])).logits[0, -1].float()
    for temperature in (0.5, 2.0):
        response = _sample(
            engine, qwen3_weights, tokenizer, prompt, 16, max_tokens=1, seed=7, temperature=temperature
        )
        firsts = [(s.tokens[0], s.logprobs[0]) for s in response.sequences if s.logprobs]
        expected = torch.log_softmax(z / temperature, dim=-1)
        for token, logprob in firsts:
            assert logprob == pytest.approx(expected[token].item(), abs=1e-4)
        (a, lp_a), (b, lp_b) = max(firsts, key=lambda f: f[1]), min(firsts, key=lambda f: f[1])
        assert a != b
        assert lp_a - lp_b == pytest.approx((z[a] - z[b]).item() / temperature, abs=1e-4)


def test_max_tokens_gives_length(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    response = _sample(
        engine, qwen3_weights, tokenizer, _prompt(tokenizer, "Count:"), 2, max_tokens=5, seed=3
    )
    for sequence in response.sequences:
        assert sequence.stop_reason == "length"
        assert len(sequence.tokens) == 5 and sequence.logprobs is not None and len(sequence.logprobs) == 5
        assert all(lp <= 0 for lp in sequence.logprobs)


def test_stop_token_id_ends_sequence_and_is_kept(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    prompt = _prompt(tokenizer, "Stop tokens")
    free = _sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=16, seed=11).sequences[0].tokens
    stop_id = free[4]
    end = free.index(stop_id)
    stopped = _sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=16, seed=11, stop=[stop_id])
    assert stopped.sequences[0].tokens == free[: end + 1]
    assert stopped.sequences[0].stop_reason == "stop"


def _spanning_stop(tokenizer: Any, tokens: list[int]) -> tuple[str, int]:
    """A 2-char stop string made of the last char of one token and the first of the next, and where it ends."""
    for i in range(1, len(tokens) - 1):
        left, right = tokenizer.decode(tokens[i]), tokenizer.decode(tokens[i + 1])
        if left and right and "\ufffd" not in left + right:
            stop = left[-1] + right[0]
            for end in range(len(tokens)):
                if stop in tokenizer.decode(tokens[: end + 1]):
                    return stop, end
    raise AssertionError(f"no two adjacent printable tokens in {tokens}")


def test_stop_string_spanning_tokens(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    prompt = _prompt(tokenizer, "A story about stop strings")
    free = _sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=24, seed=5).sequences[0].tokens
    stop, end = _spanning_stop(tokenizer, free)
    for stops in (stop, [stop, "never-appears-here"]):
        sequence = _sample(
            engine, qwen3_weights, tokenizer, prompt, max_tokens=24, seed=5, stop=stops
        ).sequences[0]
        assert sequence.tokens == free[: end + 1], stop
        assert sequence.stop_reason == "stop"
        assert stop in tokenizer.decode(sequence.tokens)
        assert stop not in tokenizer.decode(sequence.tokens[:-1])


def test_prompt_logprobs_and_topk_match_forward(
    engine: SamplerEngine, qwen3: Any, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    tokens = tokenizer.encode("How many r's are in the word strawberry?")
    future = engine.submit(
        qwen3_weights,
        tokenizer,
        types.ModelInput.from_ints(tokens),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=5,
    )
    response = future.result(timeout=60)
    reference = _hf_logprobs(qwen3, tokens)
    assert response.prompt_logprobs is not None and response.topk_prompt_logprobs is not None
    assert len(response.prompt_logprobs) == len(tokens) == len(response.topk_prompt_logprobs)
    assert response.prompt_logprobs[0] is None and response.topk_prompt_logprobs[0] is None
    for position in range(1, len(tokens)):
        assert response.prompt_logprobs[position] == pytest.approx(
            reference[position - 1, tokens[position]].item(), abs=1e-4
        )
        values, ids = reference[position - 1].topk(5)
        ranked = response.topk_prompt_logprobs[position]
        assert ranked is not None
        assert [t for t, _ in ranked] == ids.tolist()
        assert [v for _, v in ranked] == pytest.approx(values.tolist(), abs=1e-4)
        assert [v for _, v in ranked] == sorted((v for _, v in ranked), reverse=True)


def test_top_k_and_top_p(
    engine: SamplerEngine, qwen3: Any, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    tokens = tokenizer.encode("Truncated sampling")
    prompt = types.ModelInput.from_ints(tokens)
    greedy = (
        _sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=6, temperature=0.0).sequences[0].tokens
    )
    for cut in ({"top_k": 1}, {"top_p": 1e-6}):
        response = _sample(engine, qwen3_weights, tokenizer, prompt, 3, max_tokens=6, seed=2, **cut)
        assert all(s.tokens == greedy for s in response.sequences), cut
    top3 = set(_hf_logprobs(qwen3, tokens)[-1].topk(3).indices.tolist())
    response = _sample(engine, qwen3_weights, tokenizer, prompt, 24, max_tokens=1, seed=4, top_k=3)
    assert {s.tokens[0] for s in response.sequences} <= top3
    probs = _hf_logprobs(qwen3, tokens)[-1].exp()
    nucleus_size = int((probs.sort(descending=True).values.cumsum(0) < 0.5).sum()) + 1
    nucleus = set(probs.topk(nucleus_size).indices.tolist())
    response = _sample(engine, qwen3_weights, tokenizer, prompt, 24, max_tokens=1, seed=4, top_p=0.5)
    assert {s.tokens[0] for s in response.sequences} <= nucleus


def test_lora_fp32_logprobs_equal_peft_forward(engine: SamplerEngine, tokenizer: Any) -> None:
    """A random adapter (incl. the unembedding of a tied model): sampled logprobs = peft forward logprobs."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    model = _tiny_qwen3(tie_word_embeddings=True)
    base_state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "lm_head",
        ],
    )
    peft_model = get_peft_model(model, lora).eval()
    torch.manual_seed(5)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.2)
    adapter_state = get_peft_model_state_dict(peft_model)
    assert "base_model.model.lm_head.lora_A.weight" in adapter_state
    weights = SamplingWeights.build(model.config, base_state, adapter_state, lora.to_dict(), torch.float32)
    prompt_tokens = tokenizer.encode("LoRA merged sampling")
    response = _sample(
        engine, weights, tokenizer, types.ModelInput.from_ints(prompt_tokens), 2, max_tokens=10, seed=8
    )
    for sequence in response.sequences:
        reference = _hf_logprobs(peft_model, prompt_tokens + sequence.tokens)[len(prompt_tokens) - 1 : -1]
        picked = reference.gather(1, torch.tensor(sequence.tokens)[:, None])[:, 0]
        assert (torch.tensor(sequence.logprobs) - picked).abs().max() <= 1e-3
    # The snapshot copied what it merged: the base state is untouched.
    torch.testing.assert_close(
        base_state["model.layers.0.self_attn.q_proj.weight"],
        peft_model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight,
    )


def test_bf16_mode_stays_close_to_fp32(engine: SamplerEngine, qwen3: Any, tokenizer: Any, device: str) -> None:
    """bf16 weights and cache: concurrent requests of different lengths give finite logprobs near fp32 HF."""
    weights = _weights(qwen3, torch.bfloat16, device)
    prompts = [
        tokenizer.encode(text) for text in ("Lower precision", "Another prompt that is quite a bit longer")
    ]
    futures = [
        engine.submit(
            weights, tokenizer, types.ModelInput.from_ints(p), 3, types.SamplingParams(max_tokens=m, seed=9)
        )
        for p, m in zip(prompts, (12, 30))
    ]
    for prompt_tokens, future in zip(prompts, futures):
        for sequence in future.result(timeout=60).sequences:
            reference = _hf_logprobs(qwen3, prompt_tokens + sequence.tokens)[len(prompt_tokens) - 1 : -1]
            picked = reference.gather(1, torch.tensor(sequence.tokens)[:, None])[:, 0]
            assert (torch.tensor(sequence.logprobs) - picked).abs().mean() < 0.1


def test_bf16_decode_and_prefill_report_the_same_logprobs(
    engine: SamplerEngine, qwen3: Any, tokenizer: Any, device: str
) -> None:
    """A sampled token's logprob (decode path) equals its prompt logprob when the sequence is scored (prefill).

    Both paths use the same bf16 weights, fp32 attention over the same K/V values and the exact fp32 logit of the
    token, and oneDNN's bf16 matmuls give the same result for a row whatever the row count. What is left: fp32
    summation order (prefill's SDPA vs decode's two matmuls, ~1e-7 relative), which can flip the bf16 rounding of
    an activation in rare cases, and the token's logit entering the normaliser exactly in one path only. Measured
    max 5e-5; the bound 2e-3 is 40x that. Before the paths were made consistent (decode read bf16-rounded K/V with
    bf16 queries; sampled tokens outside the exact top logits kept their rounded logit) the mean was 0.02 and the
    max 0.1.
    """
    weights = _weights(qwen3, torch.bfloat16, device)
    prompt = tokenizer.encode("Prefill and decode must agree on every logprob they report")
    response = _sample(engine, weights, tokenizer, types.ModelInput.from_ints(prompt), 4, max_tokens=24, seed=3)
    for sequence in response.sequences:
        scored = engine.submit(
            weights,
            tokenizer,
            types.ModelInput.from_ints(prompt + sequence.tokens),
            1,
            types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
        ).result(timeout=60)
        assert scored.prompt_logprobs is not None
        prefill = torch.tensor(scored.prompt_logprobs[len(prompt) :])
        assert (torch.tensor(sequence.logprobs) - prefill).abs().max() <= 2e-3


def test_kv_pool_growth_keeps_contents_and_zeroes_new_space(qwen3_weights: SamplingWeights) -> None:
    spec = qwen3_weights.decoder.spec
    pool = KVPool(spec, torch.bfloat16, torch.device("cpu"))
    pool.ensure(2, 10, used_slots=0, used_length=0)
    assert pool.slots >= 2 and pool.capacity >= 10
    kv = torch.full((spec.num_layers, 2, spec.num_kv_heads, 10, spec.head_dim), 3.0)
    pool.load(1, kv)
    pool.ensure(pool.slots + 1, pool.capacity + 1, used_slots=2, used_length=10)
    assert pool.cache is not None
    assert bool((pool.cache[:, :, 1, :, :10] == 3.0).all())
    # Attention reads masked positions too: new space must hold zeros, never stale NaN bit patterns.
    assert bool((pool.cache[:, :, 1, :, 10:] == 0).all()) and bool((pool.cache[:, :, 2:] == 0).all())
    pool.move(1, 0, 10)
    assert bool((pool.cache[:, :, 0, :, :10] == 3.0).all())


def test_kv_pool_shrinks_when_far_too_large(qwen3_weights: SamplingWeights) -> None:
    pool = KVPool(qwen3_weights.decoder.spec, torch.float32, torch.device("cpu"))
    pool.ensure(200, 1000, used_slots=0, used_length=0)
    pool.cache[:, :, :2, :, :5] = 7.0  # type: ignore[index]
    big = pool.slots * pool.capacity
    pool.ensure(2, 6, used_slots=2, used_length=5)
    assert pool.slots * pool.capacity * 4 < big
    assert bool((pool.cache[:, :, :2, :, :5] == 7.0).all())  # type: ignore[index]


def test_concurrent_requests_are_batched(qwen3_weights: SamplingWeights, tokenizer: Any) -> None:
    with SamplerEngine(max_batch_sequences=8) as fresh:
        futures = [
            fresh.submit(
                qwen3_weights,
                tokenizer,
                _prompt(tokenizer, f"request number {i}"),
                2,
                types.SamplingParams(max_tokens=8, seed=i),
            )
            for i in range(10)
        ]
        # num_samples larger than the whole batch: its samples take turns in the slots.
        wide = fresh.submit(
            qwen3_weights,
            tokenizer,
            _prompt(tokenizer, "wide"),
            12,
            types.SamplingParams(max_tokens=4, seed=0),
        )
        responses = [f.result(timeout=60) for f in futures]
        assert len(wide.result(timeout=60).sequences) == 12
        stats = fresh.stats()
    assert all(len(r.sequences) == 2 and all(len(s.tokens) == 8 for s in r.sequences) for r in responses)
    assert stats.max_batch_sequences_seen == 8
    assert stats.requests_completed == 11
    assert stats.prompts_prefilled == 11 and stats.prefill_forwards < 11
    # Each decode step advanced many sequences: far fewer steps than generated tokens.
    assert stats.decode_steps < stats.tokens_generated / 4


def test_requests_with_the_same_prompt_share_one_prefill(
    qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    prompt = _prompt(tokenizer, "one prompt, many requests")
    with SamplerEngine() as fresh:
        alone = [
            fresh.submit(
                qwen3_weights, tokenizer, prompt, 2, types.SamplingParams(max_tokens=5, seed=s)
            ).result()
            for s in range(3)
        ]
        before = fresh.stats().prompts_prefilled
        # Holding the engine's lock keeps the worker from admitting until all three are queued.
        with fresh._cond:
            futures = [
                fresh.submit(qwen3_weights, tokenizer, prompt, 2, types.SamplingParams(max_tokens=5, seed=s))
                for s in range(3)
            ]
        together = [f.result(timeout=60) for f in futures]
        assert fresh.stats().prompts_prefilled == before + 1
    for a, b in zip(alone, together):
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]


def test_compute_logprobs_request_needs_no_decode_step(
    qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    with SamplerEngine() as fresh:
        response = fresh.submit(
            qwen3_weights,
            tokenizer,
            _prompt(tokenizer, "just score me"),
            1,
            types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
        ).result(timeout=60)
        assert fresh.stats().decode_steps == 0
    assert response.prompt_logprobs is not None and response.prompt_logprobs[0] is None
    assert all(isinstance(x, float) and x < 0 for x in response.prompt_logprobs[1:])
    assert response.topk_prompt_logprobs is None


# --------------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": 1e-40}, "temperature=1e-40 is too small"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"stop": ["ok", 3]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": [10**7]}, "stop"),
    ],
)
def test_bad_sampling_params_raise_naming_the_field(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any, params: dict, field: str
) -> None:
    # model_construct skips pydantic's own checks: the engine must catch what a mutated or unchecked object holds.
    with pytest.raises(BadRequestError, match=field):
        engine.submit(
            qwen3_weights,
            tokenizer,
            _prompt(tokenizer, "hi"),
            1,
            types.SamplingParams.model_construct(**params),
        )


def test_bad_requests_raise_and_engine_keeps_serving(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    params = types.SamplingParams(max_tokens=2)
    hi = _prompt(tokenizer, "hi")
    with pytest.raises(BadRequestError, match="num_samples"):
        engine.submit(qwen3_weights, tokenizer, hi, 0, params)
    with pytest.raises(BadRequestError, match="empty"):
        engine.submit(qwen3_weights, tokenizer, types.ModelInput.empty(), 1, params)
    with pytest.raises(BadRequestError, match="vocabulary"):
        engine.submit(qwen3_weights, tokenizer, types.ModelInput.from_ints([1, 151936]), 1, params)
    with pytest.raises(BadRequestError, match="topk_prompt_logprobs"):
        engine.submit(qwen3_weights, tokenizer, hi, 1, params, topk_prompt_logprobs=-1)
    image = types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)])
    with pytest.raises(UnprocessableEntityError, match="text-only"):
        engine.submit(qwen3_weights, tokenizer, image, 1, params)
    assert len(_sample(engine, qwen3_weights, tokenizer, hi, max_tokens=2).sequences[0].tokens) == 2


def test_num_samples_is_bounded_and_the_limit_itself_is_served(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    """An unbounded num_samples would hold the sampler for every later request: refused at the call site."""
    from tinker_cookbook.engine.sampling.requests import MAX_NUM_SAMPLES

    params = types.SamplingParams(max_tokens=1, seed=0)
    hi = _prompt(tokenizer, "hi")
    with pytest.raises(BadRequestError, match=rf"num_samples=100000 is more than the limit of {MAX_NUM_SAMPLES} per "
                                              r"request; split it into several sample calls"):
        engine.submit(qwen3_weights, tokenizer, hi, 100000, params)
    with pytest.raises(BadRequestError, match=f"num_samples={MAX_NUM_SAMPLES + 1} "):
        engine.submit(qwen3_weights, tokenizer, hi, MAX_NUM_SAMPLES + 1, params)
    assert len(engine.submit(qwen3_weights, tokenizer, hi, MAX_NUM_SAMPLES, params).result(timeout=120).sequences) \
        == MAX_NUM_SAMPLES


class _BrokenTokenizer:
    eos_token_id = None

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise RuntimeError("cannot decode")


def test_failure_inside_worker_fails_only_that_request(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    params = types.SamplingParams(max_tokens=6, stop=["zz"], seed=1)
    bad = engine.submit(qwen3_weights, _BrokenTokenizer(), _prompt(tokenizer, "a"), 2, params)
    good = engine.submit(qwen3_weights, tokenizer, _prompt(tokenizer, "b"), 2, params)
    with pytest.raises(RequestFailedError, match="cannot decode"):
        bad.result(timeout=60)
    assert len(good.result(timeout=60).sequences) == 2


def test_unexpected_worker_error_fails_requests_and_worker_survives(
    qwen3_weights: SamplingWeights, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = KVPool.ensure
    calls = []

    def failing_once(self: KVPool, *args: Any, **kwargs: Any) -> None:
        calls.append(args)
        if len(calls) == 1:
            raise MemoryError("no room for the cache")
        original(self, *args, **kwargs)

    monkeypatch.setattr(KVPool, "ensure", failing_once)
    with SamplerEngine() as fresh:
        params = types.SamplingParams(max_tokens=4, seed=0)
        doomed = fresh.submit(qwen3_weights, tokenizer, _prompt(tokenizer, "first"), 2, params)
        with pytest.raises(RequestFailedError, match="no room for the cache"):
            doomed.result(timeout=60)
        later = fresh.submit(qwen3_weights, tokenizer, _prompt(tokenizer, "second"), 2, params)
        assert [len(s.tokens) for s in later.result(timeout=60).sequences] == [4, 4]


def test_closed_engine_refuses_and_fails_pending(qwen3_weights: SamplingWeights, tokenizer: Any) -> None:
    closing = SamplerEngine()
    pending = closing.submit(
        qwen3_weights, tokenizer, _prompt(tokenizer, "x"), 1, types.SamplingParams(max_tokens=400)
    )
    closing.close()
    try:
        pending.result(timeout=60)
    except RequestFailedError:
        pass  # closed before it finished
    with pytest.raises(RequestFailedError, match="closed"):
        closing.submit(
            qwen3_weights, tokenizer, _prompt(tokenizer, "x"), 1, types.SamplingParams(max_tokens=1)
        )
    assert isinstance(pending, concurrent.futures.Future) and pending.done()


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
        "initializer_range": _INIT,
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
    weights = _weights(model)
    prompt = tokenizer.encode("<|im_start|>user\nDescribe nothing.<|im_end|>\n<|im_start|>assistant\n")
    greedy = _sample(
        engine, weights, tokenizer, types.ModelInput.from_ints(prompt), max_tokens=6, temperature=0.0
    )
    assert greedy.sequences[0].tokens == _hf_greedy(model, prompt, 6)


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
    greedy = _sample(engine, weights, tokenizer, types.ModelInput.from_ints(prompt), max_tokens=6, temperature=0.0)
    assert greedy.sequences[0].tokens == _hf_greedy(model, prompt, 6)


def test_default_dtype_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_COOKBOOK_SAMPLER_DTYPE", raising=False)
    assert default_sampling_dtype() in (torch.bfloat16, torch.float32)
    # CPU default: fp32, the mode whose logprobs agree with the fp32 learner (test_bf16_decode_... shows bf16's gap).
    assert default_sampling_dtype("cpu") == torch.float32
    if torch.cuda.is_available():
        assert default_sampling_dtype("cuda") == torch.bfloat16
    monkeypatch.setenv("TINKER_COOKBOOK_SAMPLER_DTYPE", "fp32")
    assert default_sampling_dtype() == torch.float32
    monkeypatch.setenv("TINKER_COOKBOOK_SAMPLER_DTYPE", "bf16")
    assert default_sampling_dtype() == torch.bfloat16
    monkeypatch.setenv("TINKER_COOKBOOK_SAMPLER_DTYPE", "fp8")
    with pytest.raises(BadRequestError, match="fp8"):
        default_sampling_dtype()


# A row whose parameters slipped past validation (here: a top_k no int64 holds, which torch refuses) must fail its
# own request only. It is planted after validation: at the first token (prefill) or at a later decode step.
_UNREPRESENTABLE = RowParams(temperature=1.0, top_k=2**64, top_p=1.0)


def _plant_bad_row(monkeypatch: pytest.MonkeyPatch, where: str, marker_seed: int) -> None:
    if where == "first token":
        original_validate = sampler_module.validate_request

        def validate(*args: Any) -> Any:
            spec = original_validate(*args)
            return dataclasses.replace(spec, row=_UNREPRESENTABLE) if spec.seed == marker_seed else spec

        monkeypatch.setattr(sampler_module, "validate_request", validate)
    else:
        original_place = DecoderBatch.place

        def place(self: DecoderBatch) -> None:
            original_place(self)
            for sequence in self.active:
                if sequence.request.spec.seed == marker_seed:
                    sequence.params = _UNREPRESENTABLE

        monkeypatch.setattr(DecoderBatch, "place", place)


@pytest.mark.parametrize("where", ["first token", "decode"])
def test_a_bad_row_fails_only_its_request_and_not_its_batch_neighbours(
    qwen3_weights: SamplingWeights, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    prompts = ["one", "two", "three", "four"]
    with SamplerEngine() as alone:  # the reference: each valid request by itself, same seeds
        expected = [alone.submit(qwen3_weights, tokenizer, _prompt(tokenizer, p), 2,
                                 types.SamplingParams(max_tokens=4, seed=i)).result(timeout=60)
                    for i, p in enumerate(prompts)]
    _plant_bad_row(monkeypatch, where, marker_seed=99)
    with SamplerEngine() as engine:
        submitted = [engine.submit(qwen3_weights, tokenizer, _prompt(tokenizer, p), 2,
                                   types.SamplingParams(max_tokens=4, seed=i)) for i, p in enumerate(prompts[:2])]
        bad = engine.submit(qwen3_weights, tokenizer, _prompt(tokenizer, "bad"), 3,
                            types.SamplingParams(max_tokens=4, seed=99))
        submitted += [engine.submit(qwen3_weights, tokenizer, _prompt(tokenizer, p), 2,
                                    types.SamplingParams(max_tokens=4, seed=i + 2)) for i, p in enumerate(prompts[2:])]
        with pytest.raises(RequestFailedError, match="sampling failed"):
            bad.result(timeout=60)
        got = [future.result(timeout=60) for future in submitted]
        assert engine.stats().max_batch_sequences_seen > 2, "the requests should have shared a batch"
    for response, reference in zip(got, expected, strict=True):
        assert [s.tokens for s in response.sequences] == [s.tokens for s in reference.sequences]


def test_select_tokens_per_owner_isolates_the_owner_of_a_bad_row() -> None:
    """The retry per owner gives the good rows exactly what the batched call would, with the same uniforms."""
    torch.manual_seed(0)
    logits = torch.randn(5, 300)
    good = RowParams(temperature=0.7, top_k=20, top_p=0.9)
    uniforms = [0.1, 0.5, 0.9, 0.3, 0.7]
    owners = ["a", "a", "b", "c", "c"]
    clean = select_tokens_per_owner(logits, [good] * 5, uniforms, owners)
    assert all(not isinstance(r, Exception) for r in clean)
    mixed = select_tokens_per_owner(logits, [good, good, _UNREPRESENTABLE, good, good], uniforms, owners)
    assert isinstance(mixed[2], Exception)
    assert [mixed[i] for i in (0, 1, 3, 4)] == [clean[i] for i in (0, 1, 3, 4)]
    # One owner only: nothing to isolate, every row carries the error.
    assert all(isinstance(r, Exception) for r in select_tokens_per_owner(logits[2:3], [_UNREPRESENTABLE], [0.5], ["b"]))


def test_a_top_k_beyond_the_vocabulary_means_no_cut(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    """Keeping more tokens than exist keeps them all: the same draws as top_k=-1, for any size of top_k."""
    hi = _prompt(tokenizer, "hi")
    unlimited = _sample(engine, qwen3_weights, tokenizer, hi, 2, max_tokens=3, seed=5, top_k=-1)
    for top_k in (151936, 2**40, 2**63 - 1):
        capped = _sample(engine, qwen3_weights, tokenizer, hi, 2, max_tokens=3, seed=5, top_k=top_k)
        assert [s.tokens for s in capped.sequences] == [s.tokens for s in unlimited.sequences]
