"""Sampler bad input and failures: refused requests, worker errors, closed engine, bad rows, default dtype."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from typing import Any

import pytest
import torch
from sampler_models import sample, text_prompt

from tinker_cookbook.engine.sampling import sampler as sampler_module
from tinker_cookbook.engine.sampling.batch import KVPool, RowParams, select_tokens_per_owner
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.steps import DecoderBatch
from tinker_cookbook.engine.sampling.weights import SamplingWeights, default_sampling_dtype
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, RequestFailedError, UnprocessableEntityError


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
            text_prompt(tokenizer, "hi"),
            1,
            types.SamplingParams.model_construct(**params),
        )


def test_bad_requests_raise_and_engine_keeps_serving(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    params = types.SamplingParams(max_tokens=2)
    hi = text_prompt(tokenizer, "hi")
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
    assert len(sample(engine, qwen3_weights, tokenizer, hi, max_tokens=2).sequences[0].tokens) == 2


def test_num_samples_is_bounded_and_the_limit_itself_is_served(
    engine: SamplerEngine, qwen3_weights: SamplingWeights, tokenizer: Any
) -> None:
    """An unbounded num_samples would hold the sampler for every later request: refused at the call site."""
    from tinker_cookbook.engine.sampling.requests import MAX_NUM_SAMPLES

    params = types.SamplingParams(max_tokens=1, seed=0)
    hi = text_prompt(tokenizer, "hi")
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
    bad = engine.submit(qwen3_weights, _BrokenTokenizer(), text_prompt(tokenizer, "a"), 2, params)
    good = engine.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, "b"), 2, params)
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
        doomed = fresh.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, "first"), 2, params)
        with pytest.raises(RequestFailedError, match="no room for the cache"):
            doomed.result(timeout=60)
        later = fresh.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, "second"), 2, params)
        assert [len(s.tokens) for s in later.result(timeout=60).sequences] == [4, 4]


def test_closed_engine_refuses_and_fails_pending(qwen3_weights: SamplingWeights, tokenizer: Any) -> None:
    closing = SamplerEngine()
    pending = closing.submit(
        qwen3_weights, tokenizer, text_prompt(tokenizer, "x"), 1, types.SamplingParams(max_tokens=400)
    )
    closing.close()
    try:
        pending.result(timeout=60)
    except RequestFailedError:
        pass  # closed before it finished
    with pytest.raises(RequestFailedError, match="closed"):
        closing.submit(
            qwen3_weights, tokenizer, text_prompt(tokenizer, "x"), 1, types.SamplingParams(max_tokens=1)
        )
    assert isinstance(pending, concurrent.futures.Future) and pending.done()


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
        expected = [alone.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, p), 2,
                                 types.SamplingParams(max_tokens=4, seed=i)).result(timeout=60)
                    for i, p in enumerate(prompts)]
    _plant_bad_row(monkeypatch, where, marker_seed=99)
    with SamplerEngine() as engine:
        submitted = [engine.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, p), 2,
                                   types.SamplingParams(max_tokens=4, seed=i)) for i, p in enumerate(prompts[:2])]
        bad = engine.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, "bad"), 3,
                            types.SamplingParams(max_tokens=4, seed=99))
        submitted += [engine.submit(qwen3_weights, tokenizer, text_prompt(tokenizer, p), 2,
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
    hi = text_prompt(tokenizer, "hi")
    unlimited = sample(engine, qwen3_weights, tokenizer, hi, 2, max_tokens=3, seed=5, top_k=-1)
    for top_k in (151936, 2**40, 2**63 - 1):
        capped = sample(engine, qwen3_weights, tokenizer, hi, 2, max_tokens=3, seed=5, top_k=top_k)
        assert [s.tokens for s in capped.sequences] == [s.tokens for s in unlimited.sequences]
