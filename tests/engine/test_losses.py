"""Built-in losses against hand-computed values.

Shared example (3 tokens): learner logp = [-1.0, -2.0, -0.5]; sampler q = [-1.0, -2.5, -0.5];
advantages A = [1, 2, -1]; ratio r = exp(logp - q) = [1, e^0.5 = 1.6487213, 1].
"""

import math

import pytest
import torch

from tinker_cookbook.engine.training import losses
from tinker_cookbook.tinker.errors import BadRequestError

LOGP = [-1.0, -2.0, -0.5]
INPUTS = {
    "logprobs": torch.tensor([-1.0, -2.5, -0.5]),
    "advantages": torch.tensor([1.0, 2.0, -1.0]),
    "weights": torch.tensor([1.0, 0.0, 1.0]),
}


def _run(name: str, config: dict | None = None) -> tuple[float, list[float]]:
    logp = torch.tensor(LOGP, requires_grad=True)
    spec = losses.get_loss(name)
    loss = spec.fn(logp, INPUTS, losses.resolve_config(name, config))
    loss.backward()
    return loss.item(), logp.grad.tolist()


def test_cross_entropy():
    # -(1*-1 + 0*-2 + 1*-0.5) = 1.5; d/dlogp = -w
    loss, grad = _run("cross_entropy")
    assert loss == pytest.approx(1.5)
    assert grad == pytest.approx([-1.0, 0.0, -1.0])


def test_importance_sampling():
    # -(1*1 + e^0.5*2 + 1*-1) = -2e^0.5 = -3.2974425; d/dlogp = -r*A
    loss, grad = _run("importance_sampling")
    assert loss == pytest.approx(-2 * math.exp(0.5), rel=1e-6)
    assert grad == pytest.approx([-1.0, -2 * math.exp(0.5), 1.0], rel=1e-6)


def test_ppo_clips_large_ratio():
    # token 2: min(1.6487*2, 1.2*2) = 2.4 -> loss = -(1 + 2.4 - 1) = -2.4; clipped token has zero gradient
    loss, grad = _run("ppo")
    assert loss == pytest.approx(-2.4, rel=1e-6)
    assert grad == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)


def test_ppo_custom_thresholds():
    # clip to [0.9, 2.0]: token 2 unclipped (1.6487 < 2) -> same as IS
    loss, _ = _run("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 2.0})
    assert loss == pytest.approx(-2 * math.exp(0.5), rel=1e-6)


def test_cispo():
    # -(1*-1*1 + 1.2*-2*2 + 1*-0.5*-1) = -(-1 - 4.8 + 0.5) = 5.3; ratio detached: d/dlogp = -clip(r)*A
    loss, grad = _run("cispo")
    assert loss == pytest.approx(5.3, rel=1e-6)
    assert grad == pytest.approx([-1.0, -2.4, 1.0], rel=1e-6)


def test_dro():
    # objective = logp*A - 0.5*beta*(logp-q)^2 = [-1, -4 - 0.025*0.25, 0.5] -> loss = 4.50625
    loss, grad = _run("dro")
    assert loss == pytest.approx(4.50625, rel=1e-6)
    # d/dlogp = -(A - beta*(logp - q)) = [-1, -(2 - 0.05*0.5), 1]
    assert grad == pytest.approx([-1.0, -1.975, 1.0], rel=1e-6)


def test_dro_beta():
    loss, _ = _run("dro", {"beta": 1.0})
    assert loss == pytest.approx(4.5 + 0.5 * 0.25, rel=1e-6)


def test_unknown_loss_and_config_key():
    with pytest.raises(BadRequestError, match="not a built-in loss"):
        losses.get_loss("mse")
    with pytest.raises(BadRequestError, match="clip_low"):
        losses.resolve_config("ppo", {"clip_low": 0.5})
    with pytest.raises(BadRequestError, match=r"clip_low_threshold'\]=1.5 is out of range; it must be in \[0, 1\]"):
        losses.resolve_config("ppo", {"clip_low_threshold": 1.5, "clip_high_threshold": 1.1})


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("name, config, message", [
    ("dro", {"beta": NAN}, r"loss_fn_config\['beta'\]=nan is not a finite number; pass a finite float such as 0.05"),
    ("dro", {"beta": INF}, r"'beta'\]=inf is not a finite number"),
    ("dro", {"beta": -INF}, r"'beta'\]=-inf is not a finite number"),
    ("dro", {"beta": 0.0}, r"'beta'\]=0.0 is out of range; it must be > 0"),
    ("dro", {"beta": -0.1}, r"'beta'\]=-0.1 is out of range"),
    ("dro", {"beta": "0.1"}, r"'beta'\]='0.1' is not a number"),
    ("dro", {"beta": True}, r"'beta'\]=True is not a number"),
    ("ppo", {"clip_low_threshold": NAN}, r"'clip_low_threshold'\]=nan is not a finite number"),
    ("ppo", {"clip_high_threshold": INF}, r"'clip_high_threshold'\]=inf is not a finite number"),
    ("cispo", {"clip_low_threshold": -0.1}, r"'clip_low_threshold'\]=-0.1 is out of range; it must be in \[0, 1\]"),
    ("cispo", {"clip_high_threshold": 0.9}, r"'clip_high_threshold'\]=0.9 is out of range; it must be >= 1"),
    ("ppo", "abc", r"loss_fn_config='abc' is a str, not a dict"),
    ("ppo", [0.8, 1.2], r"loss_fn_config=\[0.8, 1.2\] is a list, not a dict"),
    ("cross_entropy", {"beta": 0.1}, r"key 'beta' is not used by loss 'cross_entropy'; allowed keys: none"),
])
def test_config_values_must_be_finite_and_in_range(name, config, message):
    """A NaN/inf or out-of-range config value would reach every gradient: it is refused, naming key and value."""
    with pytest.raises(BadRequestError, match=message):
        losses.resolve_config(name, config)


def test_config_accepts_edges_and_numpy_numbers():
    import numpy as np

    assert losses.resolve_config("cispo", {"clip_low_threshold": 0, "clip_high_threshold": 1}) == {
        "clip_low_threshold": 0.0, "clip_high_threshold": 1.0}
    assert losses.resolve_config("dro", {"beta": np.float32(0.5)}) == {"beta": 0.5}
    assert losses.resolve_config("dro", None) == {"beta": 0.05}


# GSPO on the shared example with sequence_ratio_mask M = [0, 1, 1]: the sequence log-ratio is the mean of
# logp - q over M, (0.5 + 0) / 2 = 0.25, so s = e^0.25 = 1.2840254 at every token (the mask only picks the
# tokens the ratio is averaged over; every token with an advantage is trained).
GSPO_MASK = torch.tensor([0.0, 1.0, 1.0])
S = math.exp(0.25)


def _run_gspo(config: dict | None = None, mask: torch.Tensor = GSPO_MASK) -> tuple[float, list[float]]:
    logp = torch.tensor(LOGP, requires_grad=True)
    spec = losses.get_loss("gspo")
    inputs = {**INPUTS, "sequence_ratio_mask": mask}
    assert spec.sequence_inputs is not None
    inputs.update(spec.sequence_inputs(logp.detach(), inputs))
    loss = spec.fn(logp, inputs, losses.resolve_config("gspo", config))
    loss.backward()
    return loss.item(), logp.grad.tolist()


def test_gspo_clips_the_sequence_ratio_per_token_advantage():
    # s = 1.284 > 1.2: token 0 (A=1): min(s, 1.2) = 1.2, clipped, no gradient; token 1 (A=2): min(2s, 2.4) = 2.4,
    # clipped; token 2 (A=-1): min(-s, -1.2) = -s, unclipped, d/dlogp of -(s_t * A) = -A * s = s.
    loss, grad = _run_gspo()
    assert loss == pytest.approx(-(1.2 + 2.4 - S), rel=1e-6)
    assert grad == pytest.approx([0.0, 0.0, S], abs=1e-6)


def test_gspo_unclipped_is_the_sequence_ratio_times_the_advantage():
    # clip [0.5, 2.0] contains s: loss = -s * (1 + 2 - 1) = -2s; d/dlogp_t = -A_t * s (each token its own gradient)
    loss, grad = _run_gspo({"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    assert loss == pytest.approx(-2 * S, rel=1e-6)
    assert grad == pytest.approx([-S, -2 * S, S], rel=1e-6)


def test_gspo_ratio_is_the_geometric_mean_over_the_marked_tokens():
    # all three marked: mean log-ratio = 0.5 / 3, s = e^(1/6) = 1.1813604 (inside [0.8, 1.2]): loss = -2s
    loss, _ = _run_gspo(mask=torch.tensor([1.0, 1.0, 1.0]))
    assert loss == pytest.approx(-2 * math.exp(1 / 6), rel=1e-6)
    with pytest.raises(ValueError, match="sequence_ratio_mask'\\] marks no position"):
        _run_gspo(mask=torch.zeros(3))


def test_stable_reinforce_is_refused_with_the_reason():
    with pytest.raises(BadRequestError, match="stable_reinforce' is not available on this engine.*record_stability"):
        losses.get_loss("stable_reinforce")
    assert "stable_reinforce" not in losses.LOSSES


@pytest.mark.parametrize("name", [None, 3, ["ppo"]])
def test_loss_name_must_be_a_known_string(name):
    with pytest.raises(BadRequestError, match="not a built-in loss"):
        losses.get_loss(name)
