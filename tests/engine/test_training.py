"""The training side of the API on a tiny random model: numerics, ordering, checkpoints, bad input."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tinker_cookbook import tinker
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import (
    BadRequestError,
    NotFoundError,
    TinkerError,
    UnprocessableEntityError,
)

MODEL = "tinker-cookbook/tiny-smollm2"
VOCAB = 49152


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


def _client(service: tinker.ServiceClient, **kwargs) -> tinker.TrainingClient:
    return service.create_lora_training_client(base_model=MODEL, rank=kwargs.pop("rank", 4), seed=kwargs.pop("seed", 0),
                                               **kwargs)


def _datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    weights = weights if weights is not None else [1.0] * (len(tokens) - 1)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs=dict(target_tokens=tokens[1:], weights=weights))


def _batch(seed: int = 0, n: int = 3) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(n):
        length = int(rng.integers(5, 12))
        tokens = rng.integers(3, 2000, size=length).tolist()
        weights = [0.0] * 2 + [1.0] * (length - 3)
        data.append(_datum(tokens, weights))
    return data


def _session(tc: tinker.TrainingClient):
    return tc._backend._session(tc.model_id)  # white-box access for gradient/parameter checks


def _lora_params(tc) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in _session(tc).params.items()}


def _base_params(tc) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _session(tc).base.base_state.items()}


def _grads(tc) -> dict[str, torch.Tensor | None]:
    return {k: (None if p.grad is None else p.grad.clone()) for k, p in _session(tc).params.items()}


def test_lora_changes_base_frozen(service):
    tc = _client(service)
    lora_before, base_before = _lora_params(tc), _base_params(tc)
    tc.forward_backward(_batch(), "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    lora_after, base_after = _lora_params(tc), _base_params(tc)
    # lora_B starts at zero and gets gradient first; after a step every B tensor moved.
    changed = [k for k in lora_before if not torch.equal(lora_before[k], lora_after[k])]
    assert all(k in changed for k in lora_before if "lora_B" in k)
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)


def test_logprobs_match_independent_peft_forward(service, tmp_path):
    """Returned logprobs equal a plain transformers+peft forward of the saved adapter (fp32, 1e-4)."""
    import peft

    from tinker_cookbook.engine import models

    tc = _client(service)
    data = _batch(1)
    tc.forward_backward(data, "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    out = tc.forward(data, "cross_entropy").result()
    path = tc.save_weights_for_sampler("indep").result().path
    directory = tc._backend.store.checkpoint_dir(path)
    model = peft.PeftModel.from_pretrained(models.load_model(MODEL), str(directory)).eval()
    for datum, output in zip(data, out.loss_fn_outputs):
        ids = torch.tensor([datum.model_input.to_ints()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        targets = datum.loss_fn_inputs["target_tokens"].to_torch()
        expected = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        np.testing.assert_allclose(output["logprobs"].to_numpy(), expected.numpy(), atol=1e-4)


def test_cross_entropy_loss_sum_matches_logprobs(service):
    tc = _client(service)
    data = _batch(2)
    out = tc.forward(data, "cross_entropy").result()
    expected = -sum(float(np.dot(o["logprobs"].to_numpy(), d.loss_fn_inputs["weights"].to_numpy()))
                    for o, d in zip(out.loss_fn_outputs, data))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    assert out.loss_fn_output_type == "cross_entropy"


def test_custom_loss_equals_direct_autograd(service):
    """forward_backward_custom gives the gradient of the user's loss (compared with autograd through the model)."""
    tc = _client(service)
    tc.forward_backward(_batch(0), "cross_entropy")  # move B off zero so every LoRA tensor has gradient
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    data = _batch(3)

    def loss_fn(batch, logprobs):
        flat = torch.cat(logprobs)
        loss = (flat**2).sum() * 0.01 + torch.var(flat)
        return loss, {"custom": float(loss.detach())}

    out = tc.forward_backward_custom(data, loss_fn).result()
    ours = _grads(tc)
    assert out.metrics["custom"] == pytest.approx(out.metrics["loss:sum"])

    # Direct autograd of the same loss through the same adapter.
    session = _session(tc)
    for p in session.params.values():
        p.grad = None
    model = session.base.activate(session.run_id)
    logps = []
    for d in data:
        hidden = model.model(input_ids=torch.tensor([d.model_input.to_ints()])).last_hidden_state[0]
        logits = model.get_output_embeddings()(hidden).float()
        targets = d.loss_fn_inputs["target_tokens"].to_torch()
        logps.append(torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1))
    loss_fn(data, logps)[0].backward()
    for k, p in session.params.items():
        torch.testing.assert_close(ours[k], p.grad, rtol=1e-5, atol=1e-5)
    session.pending_backward = 1
    tc.optim_step(types.AdamParams()).result()


def test_gradients_accumulate_until_optim_step(service):
    tc = _client(service, seed=1)
    tc.forward_backward(_batch(0), "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    a, b = _batch(4, 2), _batch(5, 2)
    tc.forward_backward(a, "cross_entropy")
    tc.forward_backward(b, "cross_entropy").result()
    accumulated = _grads(tc)
    for p in _session(tc).params.values():
        p.grad = None
    tc.forward_backward(a + b, "cross_entropy").result()
    together = _grads(tc)
    # Two requests vs one: the same fp32 sums, but batched and reduced in another order (kernel blocking depends on
    # shapes and thread count), so they agree to rounding, not bitwise. Rounding error scales with the summed terms,
    # not with the result: after one Adam step every non-target row of lm_head's LoRA B is nearly the same +-lr
    # vector, so lm_head's LoRA-A gradient, B^T (softmax - onehot), cancels to ~1e-3 of its terms and differs by
    # ~2e-4 of its norm with 2 threads (1e-7 for the other tensors). Hence a per-tensor bound relative to the norm,
    # 2e-3: ~10x above that, while an accumulation bug (a request dropped or counted twice) is an O(1) difference.
    for k in together:
        norm = torch.linalg.vector_norm(together[k])
        assert norm > 0, k  # every tensor gets gradient here, so the comparison is not vacuous
        assert torch.linalg.vector_norm(accumulated[k] - together[k]) <= 2e-3 * norm, k
    tc.optim_step(types.AdamParams()).result()
    assert all(g is None for g in _grads(tc).values())


def _train(tc, steps: list[int]) -> list[float]:
    losses = []
    for step in steps:
        fb = tc.forward_backward(_batch(10 + step), "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2, weight_decay=0.01))
        losses.append(fb.result().metrics["loss:sum"])
    return losses


def test_resume_equivalence(service):
    """N steps straight == k steps + save_state + fresh client with optimizer + N-k steps (fp32, 1e-5)."""
    straight = _train(_client(service, seed=7), list(range(5)))
    first = _client(service, seed=7)
    part1 = _train(first, [0, 1])
    path = first.save_state("k2").result().path
    resumed = service.create_training_client_from_state_with_optimizer(path)
    part2 = _train(resumed, [2, 3, 4])
    np.testing.assert_allclose(part1 + part2, straight, rtol=1e-5)
    # Without the optimizer state the continuation differs (Adam moments restart).
    fresh_opt = service.create_training_client_from_state(path)
    assert not np.allclose(_train(fresh_opt, [2, 3, 4]), part2, rtol=1e-5)


def test_load_state_into_existing_client(service):
    tc = _client(service, seed=3)
    _train(tc, [0])
    path = tc.save_state("one").result().path
    before = tc.forward(_batch(9), "cross_entropy").result().metrics["loss:sum"]
    _train(tc, [1, 2])
    tc.load_state_with_optimizer(path).result()
    assert tc.forward(_batch(9), "cross_entropy").result().metrics["loss:sum"] == pytest.approx(before, rel=1e-6)


def test_back_to_back_submission_and_order(service):
    """Requests submitted without waiting run in submission order."""
    tc = _client(service)
    data = _batch(6)
    futures = []
    for _ in range(3):
        futures.append(tc.forward_backward(data, "cross_entropy"))
        futures.append(tc.optim_step(types.AdamParams(learning_rate=1e-2)))
    losses = [f.result().metrics["loss:sum"] for f in futures[::2]]
    steps = [f.result().metrics["step"] for f in futures[1::2]]
    assert steps == [1.0, 2.0, 3.0]
    assert losses[0] > losses[1] > losses[2]


def test_async_two_stage(service):
    tc = _client(service)

    async def run():
        fb_future = await tc.forward_backward_async(_batch(), "cross_entropy")
        opt_future = await tc.optim_step_async(types.AdamParams())
        assert isinstance(fb_future, tinker.APIFuture)
        fb = await fb_future
        opt = await opt_future.result_async()
        return fb, opt

    fb, opt = asyncio.run(run())
    assert "loss:sum" in fb.metrics and opt.metrics["step"] == 1.0


def test_peft_format_checkpoint(service):
    import json

    tc = _client(service)
    path = tc.save_weights_for_sampler("peft").result().path
    assert path == f"tinker://{tc.model_id}/sampler_weights/peft"
    directory = tc._backend.store.checkpoint_dir(path)
    config = json.loads((directory / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 32 and config["base_model_name_or_path"] == MODEL
    assert (directory / "adapter_model.safetensors").exists()


def test_info_and_tokenizer(service):
    tc = _client(service, rank=8)
    info = tc.get_info()
    assert info.model_id == tc.model_id and info.lora_rank == 8 and info.model_data.model_name == MODEL
    assert tc.get_tokenizer().encode("hello", add_special_tokens=False)


def test_loss_functions_through_api(service):
    tc = _client(service)
    base = _batch(8, 2)
    rl_data = []
    for d in base:
        n = d.model_input.length
        rl_data.append(types.Datum(model_input=d.model_input, loss_fn_inputs=dict(
            target_tokens=d.loss_fn_inputs["target_tokens"], logprobs=[-11.0] * n, advantages=[1.0] * n)))
    logp = tc.forward(base, "cross_entropy").result().loss_fn_outputs
    for name in ("importance_sampling", "ppo", "cispo", "dro"):
        out = tc.forward(rl_data, name).result()
        assert np.isfinite(out.metrics["loss:sum"]), name
        np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"].to_numpy(), logp[0]["logprobs"].to_numpy())
    # importance_sampling by hand from the returned logprobs
    lp = [o["logprobs"].to_numpy() for o in logp]
    expected = -sum(float(np.exp(x + 11.0).sum()) for x in lp)
    assert tc.forward(rl_data, "importance_sampling").result().metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)


# -- bad input: each is a clear TinkerError, state unchanged, next request fine --------------------------------


def _bad_cases() -> dict[str, tuple[list, str, str]]:
    good = _datum([5, 6, 7, 8])
    n = good.model_input.length
    tokens = good.loss_fn_inputs["target_tokens"]
    return {
        "length mismatch": ([types.Datum(model_input=good.model_input,
                                         loss_fn_inputs=dict(target_tokens=[1, 2], weights=[1.0, 1.0]))],
                            "cross_entropy", "shape"),
        "target out of vocab": ([types.Datum(model_input=good.model_input,
                                             loss_fn_inputs=dict(target_tokens=[1, 2, VOCAB + 5], weights=[1.0] * n))],
                                "cross_entropy", "outside the vocabulary"),
        "missing input": ([types.Datum(model_input=good.model_input, loss_fn_inputs=dict(target_tokens=tokens))],
                          "cross_entropy", "lacks"),
        "unknown loss": ([good], "mse", "not a built-in loss"),
        "nan advantages": ([types.Datum(model_input=good.model_input, loss_fn_inputs=dict(
            target_tokens=tokens, logprobs=[0.0] * n, advantages=[1.0, float("nan"), 0.0]))],
            "importance_sampling", "NaN or inf"),
        "inf weights": ([types.Datum(model_input=good.model_input,
                                     loss_fn_inputs=dict(target_tokens=tokens, weights=[1.0, float("inf"), 0.0]))],
                        "cross_entropy", "NaN or inf"),
        "float tokens": ([types.Datum(model_input=good.model_input, loss_fn_inputs=dict(
            target_tokens=types.TensorData(data=[1.0, 2.0, 3.0], dtype="float32"), weights=[1.0] * n))],
            "cross_entropy", "int64"),
        "empty batch": ([], "cross_entropy", "empty"),
        "empty input": ([types.Datum(model_input=types.ModelInput.empty(),
                                     loss_fn_inputs=dict(target_tokens=[], weights=[]))], "cross_entropy", "empty"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input_is_clear_and_harmless(service, case):
    tc = _client(service)
    tc.forward_backward(_batch(), "cross_entropy").result()
    grads_before = _grads(tc)
    data, loss, message = _bad_cases()[case]
    with pytest.raises(BadRequestError, match=message):
        tc.forward_backward(data, loss).result()
    after = _grads(tc)
    assert all(torch.equal(grads_before[k], after[k]) for k in after)
    assert tc.optim_step(types.AdamParams()).result().metrics["step"] == 1.0


def test_optim_step_without_gradients(service):
    tc = _client(service)
    with pytest.raises(BadRequestError, match="no accumulated gradients"):
        tc.optim_step(types.AdamParams()).result()
    with pytest.raises(BadRequestError, match="learning_rate"):
        tc.optim_step(types.AdamParams(learning_rate=float("nan"))).result()


def test_unknown_model_lists_loadable(service):
    with pytest.raises(NotFoundError, match="tiny-smollm2"):
        service.create_lora_training_client(base_model="acme/not-a-model")


@pytest.mark.parametrize("path", ["tinker://../weights/x", "https://example.com/weights/x", "tinker://run/other/x",
                                  "tinker://no-such-run/weights/x"])
def test_bad_paths(service, path):
    with pytest.raises(TinkerError):
        service.create_training_client_from_state(path)


def test_sampler_path_is_not_a_training_state(service):
    tc = _client(service)
    path = tc.save_weights_for_sampler("only-sampler").result().path
    with pytest.raises(BadRequestError, match="sampler"):
        tc.load_state(path).result()


def test_bad_lora_config(service):
    with pytest.raises(BadRequestError, match="rank"):
        service.create_lora_training_client(base_model=MODEL, rank=0)
    with pytest.raises(BadRequestError, match="at least one"):
        service.create_lora_training_client(base_model=MODEL, train_attn=False, train_mlp=False, train_unembed=False)


def test_length_groups_bound_padding():
    from tinker_cookbook.engine.training.passes import GROUP_MAX_PAD_FRACTION, GROUP_MAX_TOKENS, length_groups

    lengths = [64, 500, 70, 65, 512, 300, 66, 2000, 3000]
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        padded = max(lengths[i] for i in group) * len(group)
        if len(group) > 1:
            assert padded <= GROUP_MAX_TOKENS
            assert padded - sum(lengths[i] for i in group) <= GROUP_MAX_PAD_FRACTION * padded
    assert [0, 2, 3, 6] in [sorted(g) for g in groups]  # the four short ones run together


def test_batched_and_single_forward_agree(service):
    tc = _client(service, seed=5)
    data = _batch(11, 6)
    together = tc.forward(data, "cross_entropy").result().loss_fn_outputs
    for datum, out in zip(data, together):
        alone = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]
        np.testing.assert_allclose(out["logprobs"].to_numpy(), alone["logprobs"].to_numpy(), atol=1e-5)


# -- a failed request leaves the session exactly as it was ------------------------------------------------------


def _state(tc) -> dict[str, object]:
    """Everything a request could change: gradients, weights, Adam moments and counters."""
    session = _session(tc)
    opt = session.optimizer
    return {
        "grads": _grads(tc), "weights": _lora_params(tc), "pending": session.pending_backward,
        "step": opt.step_count, "exp_avg": {k: v.clone() for k, v in opt.exp_avg.items()},
        "exp_avg_sq": {k: v.clone() for k, v in opt.exp_avg_sq.items()},
    }


def _assert_same_state(before: dict, after: dict) -> None:
    assert before["pending"] == after["pending"] and before["step"] == after["step"]
    for part in ("grads", "weights", "exp_avg", "exp_avg_sq"):
        for k, v in before[part].items():
            w = after[part][k]
            assert (v is None and w is None) or (v is not None and w is not None and torch.equal(v, w)), (part, k)


def _trained_with_pending_grads(service) -> tinker.TrainingClient:
    """A client one step in (non-zero Adam state) with gradients accumulated for the next step."""
    tc = _client(service, seed=2)
    tc.forward_backward(_batch(0), "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    tc.forward_backward(_batch(1), "cross_entropy").result()
    return tc


def _rl_datum(advantage: float = 1.0) -> types.Datum:
    d = _datum([5, 6, 7, 8])
    n = d.model_input.length
    return types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": [-3.0] * n, "advantages": [advantage] * n})


def _custom(loss_value=None, metrics=None):
    def loss_fn(data, logprobs):
        loss = torch.cat(logprobs).sum() if loss_value is None else torch.cat(logprobs).sum() * 0 + loss_value
        return loss, ({"m": 1.0} if metrics is None else metrics)
    return loss_fn


def _raising_loss(data, logprobs):
    raise ZeroDivisionError("user bug")


FAILING_REQUESTS = {
    # defect 2: NaN/inf must not reach the gradients
    "dro beta nan": (lambda tc: tc.forward_backward([_rl_datum()], "dro", {"beta": float("nan")}),
                     BadRequestError, r"loss_fn_config\['beta'\]=nan is not a finite number"),
    "dro beta inf": (lambda tc: tc.forward_backward([_rl_datum()], "dro", {"beta": float("inf")}),
                     BadRequestError, r"'beta'\]=inf"),
    "loss overflows": (lambda tc: tc.forward_backward([_datum([5, 6, 7, 8], [3e38] * 3)], "cross_entropy"),
                       UnprocessableEntityError, r"the loss of data\[0\] is -?inf .*nothing was accumulated"),
    "custom loss nan": (lambda tc: tc.forward_backward_custom(_batch(), _custom(float("nan"))),
                        UnprocessableEntityError, "the custom loss is nan; nothing was accumulated"),
    "custom loss inf": (lambda tc: tc.forward_backward_custom(_batch(), _custom(float("inf"))),
                        UnprocessableEntityError, "the custom loss is inf"),
    "custom gradient nan": (lambda tc: tc.forward_backward_custom(
        _batch(), lambda d, lp: ((torch.cat(lp) - torch.cat(lp).detach()).abs().sqrt().sum(), {})),
        UnprocessableEntityError, r"gradient of the custom loss with respect to logprobs\[0\] holds NaN"),
    # defect 3: a rejected custom loss accumulates nothing
    "custom metrics str": (lambda tc: tc.forward_backward_custom(_batch(), _custom(metrics={"m": "high"})),
                           BadRequestError, r"metrics\['m'\]='high' is not a float"),
    "custom metrics list": (lambda tc: tc.forward_backward_custom(_batch(), _custom(metrics={"m": [1.0, 2.0]})),
                            BadRequestError, r"metrics\['m'\]=\[1.0, 2.0\] is not a float"),
    "custom metrics not dict": (lambda tc: tc.forward_backward_custom(_batch(), _custom(metrics=[1.0])),
                                BadRequestError, "metrics a dict"),
    "custom loss raises": (lambda tc: tc.forward_backward_custom(_batch(), _raising_loss),
                           BadRequestError, "the custom loss_fn raised ZeroDivisionError: user bug"),
    "bad data": (lambda tc: tc.forward_backward(_bad_cases()["length mismatch"][0], "cross_entropy"),
                 BadRequestError, "shape"),
    "optim_step nan lr": (lambda tc: tc.optim_step(types.AdamParams(learning_rate=float("nan"))),
                          BadRequestError, "learning_rate"),
    "optim_step None": (lambda tc: tc.optim_step(None), BadRequestError, "adam_params=None is a NoneType"),
    "load bad path": (lambda tc: tc.load_state_with_optimizer("tinker://no-such-run/weights/x"), TinkerError,
                      "no-such-run"),
}


@pytest.mark.parametrize("case", list(FAILING_REQUESTS))
def test_failed_request_leaves_session_exactly_as_before(service, case):
    tc = _trained_with_pending_grads(service)
    request, error, message = FAILING_REQUESTS[case]
    before = _state(tc)
    with pytest.raises(error, match=message):
        request(tc).result()
    _assert_same_state(before, _state(tc))
    # ... and the session goes on: the pending gradients are applied by the next step, and the logprobs are finite.
    assert tc.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["step"] == 2.0
    logprobs = tc.forward(_batch(3), "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert np.isfinite(logprobs).all()


def test_rejected_custom_loss_leaves_nothing_for_optim_step(service):
    """Defect 3 as reported: a custom loss with non-float metrics used to leave gradients that optim_step applied."""
    tc = _client(service)
    with pytest.raises(BadRequestError, match="is not a float"):
        tc.forward_backward_custom(_batch(), _custom(metrics={"m": "x"})).result()
    assert all(g is None for g in _grads(tc).values())
    with pytest.raises(BadRequestError, match="no accumulated gradients"):
        tc.optim_step(types.AdamParams()).result()


def test_custom_loss_metrics_accept_numbers_and_one_element_tensors(service):
    tc = _client(service)
    metrics = {"f": 1.5, "i": 2, "t": torch.tensor(0.25), "np": np.float32(0.5)}
    out = tc.forward_backward_custom(_batch(), _custom(metrics=metrics)).result()
    assert {k: out.metrics[k] for k in metrics} == {"f": 1.5, "i": 2.0, "t": 0.25, "np": 0.5}
    # a loss that does not depend on the logprobs has zero gradient (and is not an error)
    tc.forward_backward_custom(_batch(), lambda d, lp: (torch.tensor(1.0), {})).result()


def test_accumulated_gradients_that_overflow_are_refused(service):
    """Each request is finite, but their sum would not be: the second request is refused, the first kept."""
    tc = _client(service)
    # Per unit weight this datum's loss is ~32 and its largest gradient ~6: at 5e36 the loss (~1.6e38) stays below
    # the fp32 maximum 3.4e38 and the gradients (~3e37) overflow after about a dozen requests.
    big = [_datum([5, 6, 7, 8], [5e36] * 3)]
    tc.forward_backward(big, "cross_entropy").result()
    after_first = _grads(tc)
    assert all(bool(torch.isfinite(g).all()) for g in after_first.values() if g is not None)
    for _ in range(40):  # until the sum overflows fp32
        try:
            tc.forward_backward(big, "cross_entropy").result()
        except UnprocessableEntityError as exc:
            assert "nothing was accumulated" in str(exc)
            break
    else:
        pytest.fail("accumulating 5e36-weighted gradients never overflowed")
    assert all(bool(torch.isfinite(g).all()) for g in _grads(tc).values() if g is not None)


def test_optim_step_with_non_finite_gradients_refuses_and_discards_them(service):
    tc = _trained_with_pending_grads(service)
    session = _session(tc)
    name = next(iter(session.params))
    session.params[name].grad[0, 0] = float("inf")  # what no request can produce any more: checked at the step too
    before = _state(tc)
    with pytest.raises(UnprocessableEntityError, match=r"NaN or inf in 1 of \d+ tensors .*weights, Adam state and "
                                                       r"step count are unchanged.*gradients were discarded"):
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = _state(tc)
    assert after["pending"] == 0 and all(g is None for g in after["grads"].values())
    _assert_same_state({**before, "grads": after["grads"], "pending": 0}, after)
    tc.forward_backward(_batch(2), "cross_entropy")
    assert tc.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["step"] == 2.0


# -- a damaged checkpoint loads nothing ---------------------------------------------------------------------------


def _damage(directory, file: str, how: str) -> None:
    import safetensors.torch

    path = directory / file
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"not a safetensors file")
    elif how == "reshape":  # a valid file whose first tensor has the wrong shape
        state = safetensors.torch.load_file(str(path))
        key = min(k for k in state if k != "step")
        state[key] = torch.zeros(state[key].numel() + 1)
        safetensors.torch.save_file(state, str(path))
    elif how == "nan":
        state = safetensors.torch.load_file(str(path))
        key = min(k for k in state if k != "step")
        state[key] = torch.full_like(state[key], float("nan"))
        safetensors.torch.save_file(state, str(path))
    elif how == "delete":
        path.unlink()


@pytest.mark.parametrize("file, how, message", [
    ("optimizer.safetensors", "truncate", "optimizer.safetensors is not a readable safetensors file"),
    ("optimizer.safetensors", "reshape", "optimizer.safetensors does not fit this adapter: .* has shape"),
    ("optimizer.safetensors", "nan", "optimizer.safetensors does not fit this adapter: .* holds NaN or inf"),
    ("optimizer.safetensors", "delete", "optimizer.safetensors is missing"),
    ("adapter_model.safetensors", "garbage", "adapter_model.safetensors is not a readable safetensors file"),
    ("adapter_model.safetensors", "reshape", "adapter_model.safetensors does not match this adapter"),
    ("adapter_model.safetensors", "nan", "adapter_model.safetensors: tensor .* is not finite"),
])
def test_damaged_checkpoint_loads_nothing(service, file, how, message):
    tc = _client(service, seed=4)
    _train(tc, [0])
    path = tc.save_state(f"damaged-{how}-{file.split('.')[0]}").result().path
    _train(tc, [1])  # the session now differs from the checkpoint: a half-load would show
    tc.forward_backward(_batch(5), "cross_entropy").result()
    _damage(tc._backend.store.checkpoint_dir(path), file, how)
    before = _state(tc)
    with pytest.raises(BadRequestError, match=f"^{path}/{message}") as info:
        tc.load_state_with_optimizer(path).result()
    assert "/tmp" not in str(info.value) and str(tc._backend.store.root) not in str(info.value)
    _assert_same_state(before, _state(tc))
    sessions = set(tc._backend._sessions)
    with pytest.raises(BadRequestError, match=f"^{path}/{message}"):
        service.create_training_client_from_state_with_optimizer(path)
    tc._backend.submit(lambda: None).result()  # the engine thread is FIFO: the close submitted on failure has run
    # The half-made client was closed: no session is left that was not there before. (Sessions of clients that
    # earlier tests dropped may be released by garbage collection meanwhile, so the count can only shrink.)
    assert set(tc._backend._sessions) <= sessions
