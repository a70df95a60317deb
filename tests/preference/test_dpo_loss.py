"""The DPO loss, its gradient and every metric, against numbers computed by hand."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from pref_helpers import TINY_MODEL, dpo_builder, write_pairs

from tinker_cookbook import tinker
from tinker_cookbook.preference.train_dpo import (
    dpo_loss,
    dpo_loss_from_sums,
    make_dpo_loss_fn,
    sequence_logprobs,
    train_step,
)
from tinker_cookbook.tinker import types


def test_dpo_loss_metrics_and_gradient_by_hand():
    """Three pairs, beta = 0.5 (all inputs exact in binary, so the tie is an exact 0):

        logpi(chosen)    = [-2.0, -3.0, -1.0]   ref = [-2.5, -3.0, -1.5]  -> r_c = 0.5 * [ 0.5, 0.0, 0.5] = [ 0.25, 0.0, 0.25]
        logpi(rejected)  = [-4.0, -1.0, -2.0]   ref = [-3.0, -2.0, -2.5]  -> r_r = 0.5 * [-1.0, 1.0, 0.5] = [-0.5,  0.5, 0.25]
        margins m = r_c - r_r = [0.75, -0.5, 0.0]

        dpo_loss        = mean(log(1 + e^-m)) = (0.386871006 + 0.974076984 + 0.693147181) / 3 = 0.684698390
        accuracy        = (1 + 0 + 1/2) / 3 = 0.5        (the tie counts one half)
        margin          = (0.75 - 0.5 + 0) / 3 = 0.083333333   (beta applied once; twice would give 0.041666667)
        chosen_reward   = 0.5 / 3 = 0.166666667,  rejected_reward = 0.25 / 3 = 0.083333333,  num_pairs = 3
        d loss / d logpi(chosen_i) = -(beta / 3) * sigmoid(-m_i) = -[0.053470217, 0.103743222, 0.083333333]
        d loss / d logpi(rejected_i) = +[0.053470217, 0.103743222, 0.083333333];  the reference gets the opposite.

    Tolerance 1e-8: float64 arithmetic on a handful of terms; the written numbers have 9 significant digits.
    """
    chosen = torch.tensor([-2.0, -3.0, -1.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-4.0, -1.0, -2.0], dtype=torch.float64, requires_grad=True)
    ref_chosen = torch.tensor([-2.5, -3.0, -1.5], dtype=torch.float64, requires_grad=True)
    ref_rejected = torch.tensor([-3.0, -2.0, -2.5], dtype=torch.float64, requires_grad=True)
    loss, metrics = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    expected = {"dpo_loss": 0.684698390, "accuracy": 0.5, "margin": 0.083333333, "chosen_reward": 0.166666667,
                "rejected_reward": 0.083333333, "num_pairs": 3}
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-8), key
    assert float(loss.detach()) == pytest.approx(expected["dpo_loss"], abs=1e-8)

    loss.backward()
    coef = torch.tensor([0.053470217, 0.103743222, 0.083333333], dtype=torch.float64)
    torch.testing.assert_close(chosen.grad, -coef, atol=1e-8, rtol=0)
    torch.testing.assert_close(rejected.grad, coef, atol=1e-8, rtol=0)
    torch.testing.assert_close(ref_chosen.grad, coef, atol=1e-8, rtol=0)
    torch.testing.assert_close(ref_rejected.grad, -coef, atol=1e-8, rtol=0)


def test_sequence_logprobs_sum_only_weighted_tokens():
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [0.0, 1.0, 1.0]})
    sums = sequence_logprobs([torch.tensor([-5.0, -0.25, -0.5])], [datum])
    assert sums.tolist() == [-0.75]


def _forward_logprobs(training_client: tinker.TrainingClient, data: list[types.Datum]) -> list[torch.Tensor]:
    output = training_client.forward(data, "cross_entropy").result()
    return [out["logprobs"].to_torch() for out in output.loss_fn_outputs]


def _post_step_logprobs(data: list[types.Datum], train) -> list[torch.Tensor]:
    """Logprobs of ``data`` after one optimizer step whose update is proportional to the gradient.

    Adam's first step moves each weight by lr * g / (|g| + eps); with eps = 1e4, far above any gradient entry of
    the tiny model, that is lr / eps * g (to 1 part in 1e4 of g), so equal post-step logprobs mean equal gradients.
    """
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=TINY_MODEL, rank=4, seed=3)
    train(client)
    client.optim_step(types.AdamParams(learning_rate=2e3, eps=1e4, beta1=0.9, beta2=0.95)).result()
    return _forward_logprobs(client, data)


def test_train_step_reports_the_hand_computed_metrics_and_gradient(tmp_path):
    """Two pairs on the tiny model, beta = 0.5. The reference sums are set to the initial policy's sums minus
    chosen offsets, so the rewards do not depend on the random model:

        ref = logpi - delta,  delta(chosen) = [1.0, 0.0],  delta(rejected) = [-1.0, 1.0]
        r_c = 0.5 * [1.0, 0.0] = [0.5, 0.0],   r_r = 0.5 * [-1.0, 1.0] = [-0.5, 0.5],   m = [1.0, -0.5]

        dpo_loss = (log(1 + e^-1) + log(1 + e^0.5)) / 2 = (0.313261688 + 0.974076984) / 2 = 0.643669336
        accuracy = 0.5, margin = 0.25, chosen_reward = 0.25, rejected_reward = 0.0, num_pairs = 2
        d loss / d logpi(sequence) = -+ (beta / 2) * sigmoid(-m) = -+ [0.067235355, 0.155614833] (chosen -, rejected +)

    The gradient through ``forward_backward_custom`` must equal that of ``cross_entropy`` (loss -sum(w * logp))
    with per-token weights w = +0.067235355 / +0.155614833 on the chosen completions' tokens and the negatives on
    the rejected ones.

    Tolerances: metrics 1e-5, because the reference sums are float64 copies of fp32 logprob sums (about 30 tokens
    of magnitude ~11, relative error ~1e-7 each, so ~3e-5 in a sum, times beta = 0.5, averaged). Post-step
    logprobs 2e-4 absolute: both runs compute the same fp32 gradient by different reductions (relative ~1e-6)
    and the step moves logprobs by more than 1e-2, which the test also checks, so a wrong gradient cannot pass.
    """
    path = write_pairs(tmp_path / "pairs.jsonl", 2)
    train_ds, _ = dpo_builder(str(path), batch_size=2)()
    data = train_ds.get_batch(0)
    beta = 0.5
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=TINY_MODEL, rank=4, seed=3)
    initial = _forward_logprobs(client, data)
    policy = sequence_logprobs(initial, data).tolist()
    delta = [1.0, -1.0, 0.0, 1.0]  # interleaved: chosen0, rejected0, chosen1, rejected1
    reference = [p - d for p, d in zip(policy, delta, strict=True)]

    metrics = asyncio.run(train_step(client, data, reference, beta, types.AdamParams(learning_rate=0.0)))
    expected = {"dpo_loss": 0.643669336, "accuracy": 0.5, "margin": 0.25, "chosen_reward": 0.25,
                "rejected_reward": 0.0, "num_pairs": 2}
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-5), key

    coef = [0.067235355, -0.067235355, 0.155614833, -0.155614833]

    def by_cross_entropy(c: tinker.TrainingClient) -> None:
        scaled = [types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"],
            "weights": (d.loss_fn_inputs["weights"].to_torch() * k).tolist()}) for d, k in zip(data, coef, strict=True)]
        c.forward_backward(scaled, "cross_entropy").result()

    def by_dpo(c: tinker.TrainingClient) -> None:
        c.forward_backward_custom(data, make_dpo_loss_fn(reference, beta)).result()

    via_dpo, via_ce = _post_step_logprobs(data, by_dpo), _post_step_logprobs(data, by_cross_entropy)
    moved = max(float((a - b).abs().max()) for a, b in zip(via_dpo, initial, strict=True))
    print("MOVED", moved, max(float((a - b).abs().max()) for a, b in zip(via_dpo, via_ce, strict=True)))
    assert moved > 1e-2, "the step must move the logprobs, or the comparison proves nothing"
    for a, b in zip(via_dpo, via_ce, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=0)
    # A step down the gradient lowers the loss.
    loss_after, _ = dpo_loss_from_sums(sequence_logprobs(via_dpo, data), reference, beta)
    assert math.isfinite(float(loss_after)) and float(loss_after) < expected["dpo_loss"]
