"""Sampler semantics against HF: greedy, seeds, stops, logprobs, top-k/p, LoRA, bf16, K/V pool, batching."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sampler_models import hf_greedy, hf_logprobs, sample, sampling_weights, text_prompt, tiny_qwen3

from tinker_cookbook.engine.sampling.batch import KVPool
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.tinker import types


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
            text_prompt(tokenizer, text),
            2,
            types.SamplingParams(max_tokens=n, temperature=0.0),
        )
        for text, n in zip(texts, lengths)
    ]
    for text, n, future in zip(texts, lengths, futures):
        response = future.result(timeout=60)
        expected = hf_greedy(qwen3, tokenizer.encode(text), n)
        for sequence in response.sequences:
            assert sequence.tokens == expected
            assert sequence.stop_reason == "length"
            # Greedy logprobs are reported under the unscaled distribution.
            reference = hf_logprobs(qwen3, tokenizer.encode(text) + expected)[
                len(tokenizer.encode(text)) - 1 : -1
            ]
            picked = reference.gather(1, torch.tensor(expected)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(sequence.logprobs), picked, atol=1e-4, rtol=0)


def test_seed_gives_same_tokens_alone_and_batched(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    prompt = text_prompt(tokenizer, "Once upon a time")
    alone = sample(engine, qwen3_weights, tokenizer, prompt, 3, max_tokens=12, seed=1234)
    others = [
        engine.submit(
            qwen3_weights,
            tokenizer,
            text_prompt(tokenizer, f"other prompt {i}"),
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
    other_seed = sample(engine, qwen3_weights, tokenizer, prompt, 3, max_tokens=12, seed=99)
    assert [s.tokens for s in other_seed.sequences] != [s.tokens for s in alone.sequences]


def test_prompt_of_several_text_chunks_equals_joined_prompt(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    first, second = tokenizer.encode("Two chunks"), tokenizer.encode(" make one prompt")
    chunked = types.ModelInput(
        chunks=[types.EncodedTextChunk(tokens=first), types.EncodedTextChunk(tokens=second)]
    )
    joined = types.ModelInput.from_ints(first + second)
    a = sample(engine, qwen3_weights, tokenizer, chunked, 2, max_tokens=6, seed=21)
    b = sample(engine, qwen3_weights, tokenizer, joined, 2, max_tokens=6, seed=21)
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
        response = sample(
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
    response = sample(
        engine, qwen3_weights, tokenizer, text_prompt(tokenizer, "Count:"), 2, max_tokens=5, seed=3
    )
    for sequence in response.sequences:
        assert sequence.stop_reason == "length"
        assert len(sequence.tokens) == 5 and sequence.logprobs is not None and len(sequence.logprobs) == 5
        assert all(lp <= 0 for lp in sequence.logprobs)


def test_stop_token_id_ends_sequence_and_is_kept(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    prompt = text_prompt(tokenizer, "Stop tokens")
    free = sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=16, seed=11).sequences[0].tokens
    stop_id = free[4]
    end = free.index(stop_id)
    stopped = sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=16, seed=11, stop=[stop_id])
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
    prompt = text_prompt(tokenizer, "A story about stop strings")
    free = sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=24, seed=5).sequences[0].tokens
    stop, end = _spanning_stop(tokenizer, free)
    for stops in (stop, [stop, "never-appears-here"]):
        sequence = sample(
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
    reference = hf_logprobs(qwen3, tokens)
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
        sample(engine, qwen3_weights, tokenizer, prompt, max_tokens=6, temperature=0.0).sequences[0].tokens
    )
    for cut in ({"top_k": 1}, {"top_p": 1e-6}):
        response = sample(engine, qwen3_weights, tokenizer, prompt, 3, max_tokens=6, seed=2, **cut)
        assert all(s.tokens == greedy for s in response.sequences), cut
    top3 = set(hf_logprobs(qwen3, tokens)[-1].topk(3).indices.tolist())
    response = sample(engine, qwen3_weights, tokenizer, prompt, 24, max_tokens=1, seed=4, top_k=3)
    assert {s.tokens[0] for s in response.sequences} <= top3
    probs = hf_logprobs(qwen3, tokens)[-1].exp()
    nucleus_size = int((probs.sort(descending=True).values.cumsum(0) < 0.5).sum()) + 1
    nucleus = set(probs.topk(nucleus_size).indices.tolist())
    response = sample(engine, qwen3_weights, tokenizer, prompt, 24, max_tokens=1, seed=4, top_p=0.5)
    assert {s.tokens[0] for s in response.sequences} <= nucleus


def test_lora_fp32_logprobs_equal_peft_forward(engine: SamplerEngine, tokenizer: Any) -> None:
    """A random adapter (incl. the unembedding of a tied model): sampled logprobs = peft forward logprobs."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    model = tiny_qwen3(tie_word_embeddings=True)
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
    response = sample(
        engine, weights, tokenizer, types.ModelInput.from_ints(prompt_tokens), 2, max_tokens=10, seed=8
    )
    for sequence in response.sequences:
        reference = hf_logprobs(peft_model, prompt_tokens + sequence.tokens)[len(prompt_tokens) - 1 : -1]
        picked = reference.gather(1, torch.tensor(sequence.tokens)[:, None])[:, 0]
        assert (torch.tensor(sequence.logprobs) - picked).abs().max() <= 1e-3
    # The snapshot copied what it merged: the base state is untouched.
    torch.testing.assert_close(
        base_state["model.layers.0.self_attn.q_proj.weight"],
        peft_model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight,
    )


def test_bf16_mode_stays_close_to_fp32(engine: SamplerEngine, qwen3: Any, tokenizer: Any, device: str) -> None:
    """bf16 weights and cache: concurrent requests of different lengths give finite logprobs near fp32 HF."""
    weights = sampling_weights(qwen3, torch.bfloat16, device)
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
            reference = hf_logprobs(qwen3, prompt_tokens + sequence.tokens)[len(prompt_tokens) - 1 : -1]
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
    weights = sampling_weights(qwen3, torch.bfloat16, device)
    prompt = tokenizer.encode("Prefill and decode must agree on every logprob they report")
    response = sample(engine, weights, tokenizer, types.ModelInput.from_ints(prompt), 4, max_tokens=24, seed=3)
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
                text_prompt(tokenizer, f"request number {i}"),
                2,
                types.SamplingParams(max_tokens=8, seed=i),
            )
            for i in range(10)
        ]
        # num_samples larger than the whole batch: its samples take turns in the slots.
        wide = fresh.submit(
            qwen3_weights,
            tokenizer,
            text_prompt(tokenizer, "wide"),
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
    prompt = text_prompt(tokenizer, "one prompt, many requests")
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
            text_prompt(tokenizer, "just score me"),
            1,
            types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
        ).result(timeout=60)
        assert fresh.stats().decode_steps == 0
    assert response.prompt_logprobs is not None and response.prompt_logprobs[0] is None
    assert all(isinstance(x, float) and x < 0 for x in response.prompt_logprobs[1:])
    assert response.topk_prompt_logprobs is None
