"""Unmerged LoRA snapshots in the sampler: one shared base, per-row adapters, the merged path's results.

Tolerance of merged vs unmerged logprobs (fp32, both here): the merged path computes ``x @ (W + s B A).T`` with the
merged weight rounded to fp32, the unmerged one ``x @ W.T + (x @ (s A).T) @ B.T``: the same sums in another order.
Each matmul output then differs by at most ~(in + r) * eps * sum|x||W'| (eps = 2**-24 relative rounding; ~5e-6
relative for in = 64) and in practice by ~sqrt(in) * eps; a logprob (logit minus logsumexp, 2-Lipschitz in the
logits) of these tiny models moves by the logits' error, ~1e-5 (measured max 1.1e-5 with 1, 2 and 4 threads).
``_TOLERANCE`` is the bound the sampler's other order-only comparisons use (batched vs alone): 1e-4, 9x the
measured maximum. Tokens are compared exactly. Greedy: a flip needs a top-2 margin within ~1e-5, while the margin
between the two largest of ~1e5 random logits is typically ~0.1. Seeded: both paths draw with the same uniforms, and
a token flips only when a uniform falls within ~1e-5 of a CDF boundary. Over the whole vocabulary these random
models' distributions are nearly flat (sampled tokens at logprob -10 to -16, boundaries ~1e-6 apart), so seeded
draws here keep the top 4 tokens: ~4 boundaries, ~4e-5 chance of a flip per draw.
"""

from __future__ import annotations

import copy
import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from sampler_models import tiny_llama, tiny_qwen3

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.sampling import decoder_model as sampler_model
from tinker_cookbook.engine.sampling import lora as sampler_lora
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

_TOLERANCE = 1e-4
_SEEDED_TOP_K = 4
_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
# Three snapshots with different ranks and target sets (a layer one adapter skips adds nothing to its rows).
_ADAPTERS = [
    (4, ["q_proj", "v_proj", "o_proj"]),
    (8, ["gate_proj", "up_proj", "down_proj", "lm_head"]),
    (2, _ALL),
]



@pytest.fixture(scope="module", params=[tiny_qwen3, tiny_llama], ids=["qwen3", "llama3-tied"])
def model(request: pytest.FixtureRequest) -> Any:
    make: Callable[[], Any] = request.param
    return make()


def _base_state(model: Any, device: str) -> dict[str, torch.Tensor]:
    tied = model.config.tie_word_embeddings
    return {k: v.to(device) for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def _adapter(model: Any, seed: int, rank: int, targets: list[str]) -> tuple[dict, dict]:
    """A random PEFT adapter (B nonzero) saved as the trainer saves it."""
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets)
    peft_model = get_peft_model(copy.deepcopy(model), lora)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.normal_(0.0, 0.2)
    state = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    return {k: v.clone() for k, v in state.items()}, lora.to_dict()


@pytest.fixture(scope="module")
def snapshots(model: Any, device: str) -> dict[str, Any]:
    """The base and three adapters, each built merged and unmerged (fp32)."""
    state = _base_state(model, device)
    adapters = [_adapter(model, 10 + i, rank, targets) for i, (rank, targets) in enumerate(_ADAPTERS)]

    def build(mode: str) -> list[SamplingWeights]:
        base = SamplingWeights.build(model.config, state, None, None, torch.float32, lora_mode=mode)
        return [base] + [
            SamplingWeights.build(model.config, state, a, c, torch.float32, lora_mode=mode) for a, c in adapters
        ]

    return {"state": state, "adapters": adapters, "merged": build("merged"), "unmerged": build("unmerged")}


def _max_difference(got: list[float | None] | None, want: list[float | None] | None) -> float:
    assert got is not None and want is not None and len(got) == len(want)
    return max(abs(x - y) for x, y in zip(got, want, strict=True) if x is not None and y is not None)


def _assert_same_samples(got: types.SampleResponse, want: types.SampleResponse) -> None:
    assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    for a, b in zip(got.sequences, want.sequences, strict=True):
        assert _max_difference(list(a.logprobs or []), list(b.logprobs or [])) <= _TOLERANCE
    if want.prompt_logprobs is not None:
        assert _max_difference(got.prompt_logprobs, want.prompt_logprobs) <= _TOLERANCE


# --------------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
def test_unmerged_snapshot_samples_as_merged(
    engine: SamplerEngine, snapshots: dict[str, Any], tokenizer: Any, temperature: float
) -> None:
    """Each snapshot alone: tokens equal, sampled and prompt logprobs within the rounding tolerance."""
    prompt = types.ModelInput.from_ints(tokenizer.encode("Sampling from an adapter kept apart"))
    params = types.SamplingParams(max_tokens=16, temperature=temperature, top_k=_SEEDED_TOP_K, seed=7)
    for merged, unmerged in zip(snapshots["merged"][1:], snapshots["unmerged"][1:], strict=True):
        assert merged.adapter is None and unmerged.adapter is not None
        want = engine.submit(merged, tokenizer, prompt, 3, params, include_prompt_logprobs=True).result(timeout=60)
        got = engine.submit(unmerged, tokenizer, prompt, 3, params, include_prompt_logprobs=True).result(timeout=60)
        _assert_same_samples(got, want)


def test_three_snapshots_and_the_base_decode_together_as_each_alone(
    snapshots: dict[str, Any], tokenizer: Any
) -> None:
    """Requests of three unmerged snapshots and of the base, submitted together, decode in one batch (rows of
    four adapters, interleaved as sequences finish at different lengths) and give each request the merged
    snapshot's result when run alone; the same prompt under two snapshots keeps each snapshot's own K/V."""
    texts = ["The same prompt for everyone", "A second prompt", "Three"]
    jobs = [
        (snapshot, text, types.SamplingParams(max_tokens=6 + 5 * ((snapshot + i) % 3), temperature=t,
                                              top_k=_SEEDED_TOP_K, seed=snapshot))
        for i, text in enumerate(texts)
        for snapshot in range(4)
        for t in (0.0, 1.0)
    ]
    with SamplerEngine(max_batch_sequences=128) as mixed:
        futures = [
            mixed.submit(snapshots["unmerged"][s], tokenizer, types.ModelInput.from_ints(tokenizer.encode(text)), 2, p)
            for s, text, p in jobs
        ]
        results = [f.result(timeout=120) for f in futures]
        stats = mixed.stats()
    # All 48 sequences shared decode steps: one batch for the base and its snapshots.
    assert stats.max_batch_sequences_seen == 2 * len(jobs)
    with SamplerEngine() as alone:
        for (s, text, p), got in zip(jobs, results, strict=True):
            prompt = types.ModelInput.from_ints(tokenizer.encode(text))
            want = alone.submit(snapshots["merged"][s], tokenizer, prompt, 2, p).result(timeout=60)
            _assert_same_samples(got, want)
    # The shared prompt did give different continuations under different adapters (it is a meaningful check).
    greedy_first = {tuple(results[2 * s].sequences[0].tokens) for s in range(4)}
    assert len(greedy_first) > 1


def test_bf16_unmerged_decode_and_prefill_report_the_same_logprobs(
    engine: SamplerEngine, model: Any, snapshots: dict[str, Any], tokenizer: Any
) -> None:
    """bf16 weights with an unmerged adapter on the unembedding too: a sampled token's logprob (decode, exact
    logit through ``token_logits``) agrees with its prompt logprob when the sequence is scored (prefill, ``logits``
    with the scored column recomputed), both with the LoRA update of the unembedding.

    Not to the merged bf16 mode's 2e-3 (test_sampler_semantics.py): there the bf16 matmuls give a row the same
    result whatever the row count, and only attention's fp32 summation order differs. Here the fp32 LoRA matmuls
    round differently with the row count (prefill packs the prompt, decode runs a row per sequence), and each such
    1e-7 difference can flip the bf16 rounding of the next matmul's input (a 2**-8 relative step): measured mean
    5e-3, max 0.035 (Llama-shaped). Bounds: mean 0.02, max 0.1, below the bf16 mode's own error against fp32 on
    these logprobs (0.1-0.25 measured)."""
    adapter_state, config = snapshots["adapters"][2]
    weights = SamplingWeights.build(model.config, snapshots["state"], adapter_state, config, torch.bfloat16, "unmerged")
    assert weights.adapter is not None and weights.adapter.unembed is not None
    prompt = tokenizer.encode("Prefill and decode agree with the adapter kept apart")
    params = types.SamplingParams(max_tokens=16, seed=3)
    response = engine.submit(weights, tokenizer, types.ModelInput.from_ints(prompt), 3, params).result(timeout=60)
    for sequence in response.sequences:
        scored = engine.submit(
            weights, tokenizer, types.ModelInput.from_ints(prompt + sequence.tokens), 1,
            types.SamplingParams(max_tokens=1), include_prompt_logprobs=True,
        ).result(timeout=60)
        assert scored.prompt_logprobs is not None
        difference = (torch.tensor(sequence.logprobs) - torch.tensor(scored.prompt_logprobs[len(prompt) :])).abs()
        assert float(difference.mean()) <= 0.02 and float(difference.max()) <= 0.1
        # And both near the fp32 snapshot's logprobs of the same tokens: the bf16 mode's own error (measured mean
        # 0.02-0.06 per sequence; bound 0.1 as in test_sampler_semantics.py's bf16 test). Without the LoRA update in
        # the recomputed top logits (both paths alike, so they would still agree) the mean is 0.5-1.3.
        fp32 = engine.submit(
            snapshots["unmerged"][3], tokenizer, types.ModelInput.from_ints(prompt + sequence.tokens), 1,
            types.SamplingParams(max_tokens=1), include_prompt_logprobs=True,
        ).result(timeout=60)
        assert fp32.prompt_logprobs is not None
        error = (torch.tensor(sequence.logprobs) - torch.tensor(fp32.prompt_logprobs[len(prompt) :])).abs()
        assert float(error.mean()) < 0.1


def _matmul_inputs(decoder: sampler_model.DecoderWeights, rows: int) -> dict[str, torch.Tensor]:
    spec = decoder.spec
    widths = {
        "qkv": spec.hidden_size,
        "o_proj": spec.num_heads * spec.head_dim,
        "gate_up": spec.hidden_size,
        "down": spec.intermediate_size,
    }
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(rows, width, generator=generator).to(decoder.device) for name, width in widths.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_of_several_adapters_equal_each_adapter_alone(
    model: Any, snapshots: dict[str, Any], dtype: torch.dtype
) -> None:
    """The per-row view, with interleaved rows (index path) and contiguous rows (slice path): every fused matmul
    and the logits of a row equal those of its adapter alone (the same operations on the same row; only the
    matmuls' row counts differ: fp32 rounding, as in the module docstring)."""
    built = [
        SamplingWeights.build(model.config, snapshots["state"], a, c, dtype, lora_mode="unmerged")
        for a, c in [(None, None), *snapshots["adapters"]]
    ]
    base = built[0].decoder
    assert all(w.decoder is base for w in built)
    for order in ([0, 1, 2, 3, 1, 2, 0, 3, 3], [1, 1, 2, 2, 2, 0, 3, 3, 3]):
        row_adapters = [built[i].adapter for i in order]
        view = sampler_lora.for_rows(base, row_adapters)
        alone = [w.model for w in (built[i] for i in order)]
        for name, x in _matmul_inputs(base, len(order)).items():
            got = getattr(view.layers[1], name)(x)
            want = torch.cat([getattr(w.layers[1], name)(x[i : i + 1]) for i, w in enumerate(alone)])
            torch.testing.assert_close(got, want, atol=_TOLERANCE, rtol=1e-5)
        hidden = _matmul_inputs(base, len(order))["qkv"]
        got_logits = sampler_model.logits(view, hidden)
        want_logits = torch.cat([sampler_model.logits(w, hidden[i : i + 1]) for i, w in enumerate(alone)])
        top = sampler_model.top_columns(want_logits, 4)
        torch.testing.assert_close(got_logits.gather(1, top), want_logits.gather(1, top), atol=_TOLERANCE, rtol=0)
        token = sampler_model.token_logits(view, hidden, top[:, 0])
        if dtype == torch.float32:
            assert token is None
            continue
        # bf16: the top logits are recomputed in fp32 from the bf16 unembedding, the LoRA update added in fp32.
        # Against the fp32 snapshots' logits they differ only by the unembedding's bf16 rounding (relative
        # 2**-9 per weight): |difference| <= 2**-9 * sum |x| |w|, checked with bound 2**-8.
        assert token is not None
        fp32 = snapshots["unmerged"][0].decoder
        reference = sampler_model.logits(sampler_lora.for_rows(fp32, [
            snapshots["unmerged"][i].adapter for i in order
        ]), hidden).gather(1, top[:, :1])[:, 0]
        x = sampler_model.rms_norm(hidden, fp32.final_norm, fp32.spec.rms_eps)
        bound = 2**-8 * (x.abs()[:, None, :] * fp32.lm_head[top[:, :1]].abs()).sum(-1)[:, 0] + _TOLERANCE
        assert bool(((token - reference).abs() <= bound).all())
        torch.testing.assert_close(token, want_logits.gather(1, top)[:, 0], atol=_TOLERANCE, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# Memory and lifetime
# --------------------------------------------------------------------------------------------------------------


def test_unmerged_snapshots_hold_only_their_factors(snapshots: dict[str, Any]) -> None:
    """Three unmerged snapshots beside the base hold no weight of their own but their LoRA factors; three merged
    snapshots each hold a full copy of the adapted matmuls (the count would see one)."""
    unmerged, merged = snapshots["unmerged"], snapshots["merged"]
    base = sampler_lora.held_storages(unmerged[0])
    base_bytes = sum(base.values())
    for weights, (adapter_state, _) in zip(unmerged[1:], snapshots["adapters"], strict=True):
        assert weights.decoder is unmerged[0].decoder and weights.adapter is not None
        own = {ptr: size for ptr, size in sampler_lora.held_storages(weights).items() if ptr not in base}
        assert sum(own.values()) == weights.adapter.num_bytes()
        # The factors as PEFT holds them, at most 3x: A stacked as is, B block-diagonal over at most 3 parts
        # (q|k|v), the unembedding's B in two layouts.
        factors = sum(t.numel() * 4 for t in adapter_state.values())
        assert weights.adapter.num_bytes() <= 3 * factors < base_bytes
    for weights in merged[1:]:
        own = {ptr: size for ptr, size in sampler_lora.held_storages(weights).items() if ptr not in sampler_lora.held_storages(merged[0])}
        matmuls = sum(
            getattr(layer, name).num_bytes() for layer in weights.decoder.layers for name in ("qkv", "o_proj")
        )
        assert sum(own.values()) >= matmuls


def test_dropped_snapshots_free_their_adapters_and_the_last_one_the_base(
    model: Any, snapshots: dict[str, Any], tokenizer: Any
) -> None:
    """After sampling, dropping an unmerged snapshot frees its factors; dropping the last user of a base frees
    the shared base too (nothing else, such as the engine or the base cache, keeps them)."""
    state = {k: v.clone() for k, v in snapshots["state"].items()}  # a base of its own, not the fixtures'
    (first_state, first_config), (second_state, second_config) = snapshots["adapters"][:2]
    one = SamplingWeights.build(model.config, state, first_state, first_config, torch.float32, lora_mode="unmerged")
    two = SamplingWeights.build(model.config, state, second_state, second_config, torch.float32, "unmerged")
    with SamplerEngine() as engine:
        prompt = types.ModelInput.from_ints(tokenizer.encode("lifetime"))
        futures = [engine.submit(w, tokenizer, prompt, 2, types.SamplingParams(max_tokens=4)) for w in (one, two)]
        for future in futures:
            future.result(timeout=60)
        assert one.adapter is not None and two.adapter is not None
        factors = weakref.ref(one.adapter.layers[0]["qkv"].down.weight)
        base = weakref.ref(one.decoder)
        del one, futures

        assert _freed(factors) and base() is not None
        del two
        assert _freed(base)


def _freed(ref: weakref.ref[Any]) -> bool:
    """Whether ``ref``'s object is freed once the engine's worker has finished its round (it settles futures
    during the round, so the caller may get here first); a worker that keeps it never lets it go."""
    deadline = time.monotonic() + 30.0
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return ref() is None


# --------------------------------------------------------------------------------------------------------------
# Mode choice
# --------------------------------------------------------------------------------------------------------------


def test_mode_argument_env_and_auto(
    model: Any, snapshots: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, (adapter_state, config) = snapshots["state"], snapshots["adapters"][2]

    def build(mode: str | None = None) -> SamplingWeights:
        return SamplingWeights.build(model.config, state, adapter_state, config, torch.float32, lora_mode=mode)

    monkeypatch.delenv(settings.SAMPLER_LORA_ENV, raising=False)
    assert build().adapter is None  # auto: a small model on a machine with memory to spare merges
    monkeypatch.setattr(sampler_lora, "UNMERGED_MIN_BYTES", 1)
    assert build().adapter is not None  # auto: past the size threshold it keeps the adapter apart
    monkeypatch.setenv(settings.SAMPLER_LORA_ENV, "merged")
    assert build().adapter is None
    assert build("unmerged").adapter is not None  # the argument wins over the environment
    monkeypatch.setenv(settings.SAMPLER_LORA_ENV, "apart")
    with pytest.raises(BadRequestError, match=r"TINKER_COOKBOOK_SAMPLER_LORA='apart'.*merged, unmerged"):
        build()
    with pytest.raises(BadRequestError, match=r"lora_mode='fused'"):
        build("fused")


def test_adapters_that_change_more_than_a_matmul_are_merged(model: Any, snapshots: dict[str, Any]) -> None:
    """A full-weight override that differs from the base (PEFT's modules_to_save) cannot be a low-rank update:
    even forced unmerged, such a snapshot merges (and samples as it did). One equal to the base is dropped."""
    state, (adapter_state, config) = snapshots["state"], snapshots["adapters"][1]
    embed_key = "model.embed_tokens.weight"
    norm_key = "model.norm.weight"
    same = {**adapter_state, f"base_model.model.{norm_key}": state[norm_key].clone()}
    changed = {**adapter_state, f"base_model.model.{norm_key}": state[norm_key] + 1.0}
    assert SamplingWeights.build(model.config, state, same, config, torch.float32, "unmerged").adapter is not None
    kept = SamplingWeights.build(model.config, state, changed, config, torch.float32, "unmerged")
    assert kept.adapter is None
    assert torch.equal(kept.decoder.final_norm, state[norm_key] + 1.0)
    assert embed_key in state


def test_mis_shaped_adapter_is_refused_naming_the_module(model: Any, snapshots: dict[str, Any]) -> None:
    state, (adapter_state, config) = snapshots["state"], snapshots["adapters"][0]
    key = next(k for k in adapter_state if "q_proj.lora_A" in k)
    bad = {**adapter_state, key: torch.zeros(adapter_state[key].shape[0], 3)}
    with pytest.raises(BadRequestError, match=r"q_proj'.*pass an adapter trained on this base model"):
        SamplingWeights.build(model.config, state, bad, config, torch.float32, "unmerged")


# --------------------------------------------------------------------------------------------------------------
# Through the public API
# --------------------------------------------------------------------------------------------------------------


def test_trained_snapshots_through_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trained adapter's snapshot taken unmerged (the environment variable) samples as the same adapter's merged
    snapshot, while it decodes beside another snapshot and the base model, all sharing one base."""
    from tinker_cookbook import tinker

    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model="tinker-cookbook/tiny-smollm2", rank=4, seed=0)
    tokens = list(range(100, 140))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs=dict(target_tokens=tokens[1:], weights=[1.0] * (len(tokens) - 1)))

    def step() -> None:
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()

    monkeypatch.setenv(settings.SAMPLER_LORA_ENV, "unmerged")
    step()
    earlier = training.save_weights_and_get_sampling_client()
    step()
    unmerged = training.save_weights_and_get_sampling_client()
    base = service.create_sampling_client(base_model="tinker-cookbook/tiny-smollm2")
    monkeypatch.setenv(settings.SAMPLER_LORA_ENV, "merged")
    merged = training.save_weights_and_get_sampling_client()
    handles = [c._handle.weights for c in (earlier, unmerged, base, merged)]
    assert handles[0].decoder is handles[1].decoder is handles[2].decoder is not handles[3].decoder
    assert handles[1].adapter is not None and handles[3].adapter is None

    prompt = types.ModelInput.from_ints(list(range(300, 320)))
    params = types.SamplingParams(max_tokens=12, temperature=1.0, top_k=_SEEDED_TOP_K, seed=5)
    together = [c.sample(prompt, 3, params) for c in (earlier, unmerged, base)]
    got = together[1].result(timeout=60)
    for future in together:
        future.result(timeout=60)
    _assert_same_samples(got, merged.sample(prompt, 3, params).result(timeout=60))


