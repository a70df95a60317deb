"""KL estimators, entropy and the KL penalty on hand-computed numbers."""

import numpy as np
import pytest

from tinker_cookbook import tinker
from tinker_cookbook.rl.metrics import apply_kl_penalty, compute_kl_sample_train, discounted_future_sum


def _datum(logprobs, mask, advantages=None):
    n = len(logprobs)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(range(n))),
        loss_fn_inputs={"target_tokens": list(range(1, n + 1)), "logprobs": logprobs,
                        "advantages": advantages or [0.0] * n, "mask": mask},
    )


def test_kl_estimators_and_entropy_by_hand():
    """Action tokens: sampled q = (-1, -2, -0.5), learner p = (-1.5, -1, -0.5) → d = q − p = (0.5, -1, 0).

    v1 = mean(d) = -0.5/3; v2 = ½·mean(d²) = ½·1.25/3; entropy = −mean(q) = 3.5/3. The prompt token (mask 0,
    logprob 0 vs learner −7) must not count.
    """
    data = [_datum([0.0, -1.0, -2.0], [0.0, 1.0, 1.0]), _datum([-0.5], [1.0])]
    learner = [np.array([-7.0, -1.5, -1.0]), np.array([-0.5])]
    m = compute_kl_sample_train(data, learner)
    assert m["optim/kl_sample_train_v1"] == pytest.approx(-0.5 / 3)
    assert m["optim/kl_sample_train_v2"] == pytest.approx(0.5 * 1.25 / 3)
    assert m["optim/entropy"] == pytest.approx(3.5 / 3)


def test_kl_requires_matching_lengths():
    with pytest.raises(ValueError, match="training logprobs"):
        compute_kl_sample_train([_datum([-1.0, -1.0], [1.0, 1.0])], [np.array([-1.0])])


def test_kl_penalty_by_hand():
    """d = q − ref over action tokens: datum0 (−1 − (−2), −1 − (−1)) = (1, 0); datum1 (−2 − (−1)) = (−1).

    avg = 0/3 = 0, so with coef 0.5 the advantage bonus is 0.5·(avg − d) = (−0.5, 0, +0.5); the prompt token
    (mask 0) is untouched.
    """
    data = [_datum([0.0, -1.0, -1.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0]), _datum([-2.0], [1.0], [-1.0])]
    refs = [np.array([-9.0, -2.0, -1.0]), np.array([-1.0])]
    new, metrics = apply_kl_penalty(data, refs, kl_penalty_coef=0.5)
    assert metrics["kl_policy_base"] == pytest.approx(0.0)
    assert new[0].loss_fn_inputs["advantages"].tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert new[1].loss_fn_inputs["advantages"].tolist() == pytest.approx([-0.5])
    assert data[0].loss_fn_inputs["advantages"].tolist() == [0.0, 1.0, 1.0]  # inputs not mutated


def test_discounted_future_sum():
    assert discounted_future_sum(np.array([1.0, 2.0, 4.0]), 0.5).tolist() == [1 + 1 + 1, 2 + 2, 4]
