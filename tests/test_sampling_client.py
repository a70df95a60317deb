"""SamplingClient through the public API: snapshots, saved adapters, logprob agreement with training, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tinker_cookbook import tinker
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, NotFoundError

MODEL = "tinker-cookbook/tiny-smollm2"


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


@pytest.fixture
def fp32_sampler(monkeypatch):
    monkeypatch.setenv("TINKER_COOKBOOK_SAMPLER_DTYPE", "fp32")


def _train_steps(tc: tinker.TrainingClient, steps: int, lr: float = 5e-2) -> None:
    tokens = list(range(100, 140))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs=dict(target_tokens=tokens[1:], weights=[1.0] * (len(tokens) - 1)))
    for _ in range(steps):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=lr))


def _train_logprobs(tc: tinker.TrainingClient, tokens: list[int]) -> np.ndarray:
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs=dict(target_tokens=tokens[1:], weights=[1.0] * (len(tokens) - 1)))
    return tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_compute_logprobs_equals_training_forward(service, fp32_sampler):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    _train_steps(tc, 2)
    tokens = list(range(300, 330))
    sampler = tc.save_weights_and_get_sampling_client()
    lp = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert lp[0] is None and len(lp) == len(tokens)
    np.testing.assert_allclose(np.array(lp[1:]), _train_logprobs(tc, tokens), atol=1e-3)


def test_sampled_logprobs_equal_training_logprobs(service, fp32_sampler):
    """Temperature-1 sampled logprobs equal the learner's logprobs of the same tokens (fp32, 1e-3)."""
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=1)
    _train_steps(tc, 1)
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = list(range(500, 510))
    res = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6, seed=3)).result()
    for seq in res.sequences:
        full = prompt + seq.tokens
        learner = _train_logprobs(tc, full)[len(prompt) - 1:]
        np.testing.assert_allclose(np.array(seq.logprobs), learner, atol=1e-3)


def test_snapshot_unaffected_by_later_training(service):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=2)
    _train_steps(tc, 1)
    snapshot = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(list(range(200, 220)))
    before = snapshot.compute_logprobs(prompt).result()
    _train_steps(tc, 3)
    assert snapshot.compute_logprobs(prompt).result() == before
    after = tc.save_weights_and_get_sampling_client().compute_logprobs(prompt).result()
    assert not np.allclose(np.array(after[1:]), np.array(before[1:]))


def test_saved_sampler_weights_load_by_path(service):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3)
    _train_steps(tc, 1)
    path = tc.save_weights_for_sampler("s").result().path
    prompt = types.ModelInput.from_ints(list(range(10, 30)))
    from_path = service.create_sampling_client(model_path=path)
    assert from_path.get_base_model() == MODEL and from_path.model_path == path
    snapshot = tc.save_weights_and_get_sampling_client()
    np.testing.assert_allclose(np.array(from_path.compute_logprobs(prompt).result()[1:]),
                               np.array(snapshot.compute_logprobs(prompt).result()[1:]), atol=1e-5)
    named = tc.save_weights_and_get_sampling_client(name="named")
    assert named.model_path == f"tinker://{tc.model_id}/sampler_weights/named"


def test_base_model_sampling_and_greedy_determinism(service):
    sampler = service.create_sampling_client(base_model=MODEL)
    prompt = types.ModelInput.from_ints([1, 2, 3, 4])
    params = types.SamplingParams(max_tokens=5, temperature=0.0)
    a = sampler.sample(prompt, 3, params).result()
    assert len(a.sequences) == 3 and all(s.tokens == a.sequences[0].tokens for s in a.sequences)
    assert all(s.stop_reason == "length" and len(s.tokens) == 5 for s in a.sequences)


def test_sample_async(service):
    import asyncio

    sampler = service.create_sampling_client(base_model=MODEL)

    async def many():
        params = types.SamplingParams(max_tokens=3, seed=1)
        return await asyncio.gather(*[sampler.sample_async(types.ModelInput.from_ints([5, 6, i + 7]), 2, params)
                                      for i in range(6)])

    results = asyncio.run(many())
    assert len(results) == 6 and all(len(r.sequences) == 2 for r in results)


def test_bad_sampling_requests(service):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=4)
    state_path = tc.save_state("state").result().path
    with pytest.raises(BadRequestError, match="sampler_weights"):
        service.create_sampling_client(model_path=state_path)
    with pytest.raises(NotFoundError):
        service.create_sampling_client(model_path=f"tinker://{tc.model_id}/sampler_weights/missing")
    with pytest.raises(BadRequestError, match="exactly one"):
        service.create_sampling_client()
    sampler = service.create_sampling_client(base_model=MODEL)
    prompt = types.ModelInput.from_ints([1, 2, 3])
    for params, num_samples, field in [
        (types.SamplingParams(max_tokens=0), 1, "max_tokens"),
        (types.SamplingParams(max_tokens=2, temperature=-1.0), 1, "temperature"),
        (types.SamplingParams(max_tokens=2, top_p=0.0), 1, "top_p"),
        (types.SamplingParams(max_tokens=2, top_k=-2), 1, "top_k"),
        (types.SamplingParams(max_tokens=2), 0, "num_samples"),
    ]:
        with pytest.raises(BadRequestError, match=field):
            sampler.sample(prompt, num_samples, params).result()
    with pytest.raises(BadRequestError):
        sampler.sample(types.ModelInput.from_ints([10**7]), 1, types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(BadRequestError):
        sampler.sample(types.ModelInput.empty(), 1, types.SamplingParams(max_tokens=2)).result()
    # the engine keeps serving
    assert sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result().sequences


def test_quickstart_recipe_runs_and_learns():
    from recipes.quickstart import Config, main

    losses = main(Config(model_name=MODEL, steps=3, rank=4, learning_rate=1e-2))
    assert len(losses) == 3 and losses[-1] < losses[0]
