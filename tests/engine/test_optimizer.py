"""AdamW against a hand-computed first step and against torch.optim.AdamW over several steps."""

import pytest
import torch

from tinker_cookbook.engine.training.optimizer import AdamW, InvalidState, NonFiniteStep
from tinker_cookbook.tinker import types


def test_first_step_by_hand():
    # Step 1 of Adam moves each parameter by lr * sign(g) (bias-corrected m/sqrt(v) = g/|g|), eps negligible.
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, -3.0])
    opt = AdamW({"p": p})
    metrics = opt.step(types.AdamParams(learning_rate=0.1))
    assert p.detach().tolist() == pytest.approx([0.9, -1.9], abs=1e-6)
    assert metrics["grad_norm"] == pytest.approx((0.25 + 9.0) ** 0.5)


def test_weight_decay_and_clipping():
    p = torch.nn.Parameter(torch.tensor([2.0]))
    p.grad = torch.tensor([10.0])
    opt = AdamW({"p": p})
    # decoupled decay: p *= 1 - lr*wd = 1 - 0.1*0.5 -> 1.9, then Adam step -0.1 -> 1.8; clipping keeps sign
    opt.step(types.AdamParams(learning_rate=0.1, weight_decay=0.5, grad_clip_norm=1.0))
    assert p.item() == pytest.approx(1.8, abs=1e-6)


def test_matches_torch_adamw():
    torch.manual_seed(0)
    init = torch.randn(5, 3)
    ours = torch.nn.Parameter(init.clone())
    ref = torch.nn.Parameter(init.clone())
    hp = types.AdamParams(learning_rate=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    opt = AdamW({"w": ours})
    ref_opt = torch.optim.AdamW([ref], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(5):
        grad = torch.randn(5, 3, generator=torch.Generator().manual_seed(step))
        ours.grad, ref.grad = grad.clone(), grad.clone()
        opt.step(hp)
        ref_opt.step()
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-5, atol=1e-6)


def test_state_roundtrip():
    p = torch.nn.Parameter(torch.ones(3))
    opt = AdamW({"p": p})
    p.grad = torch.ones(3)
    opt.step(types.AdamParams())
    restored = AdamW({"p": torch.nn.Parameter(torch.ones(3))})
    restored.load_state_tensors(opt.state_tensors())
    assert restored.step_count == 1
    torch.testing.assert_close(restored.exp_avg["p"], opt.exp_avg["p"])


def _stepped() -> tuple[AdamW, torch.nn.Parameter]:
    """An optimizer one step in (non-zero moments), with fresh gradients pending."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = AdamW({"p": p})
    p.grad = torch.tensor([0.1, 0.2, -0.3])
    opt.step(types.AdamParams(learning_rate=0.1))
    return opt, p


def _snapshot(opt: AdamW) -> tuple[int, list[torch.Tensor]]:
    return opt.step_count, [t.detach().clone() for t in (opt.params["p"], opt.exp_avg["p"], opt.exp_avg_sq["p"])]


def _assert_unchanged(opt: AdamW, before: tuple[int, list[torch.Tensor]]) -> None:
    count, tensors = _snapshot(opt)
    assert count == before[0]
    assert all(torch.equal(a, b) for a, b in zip(tensors, before[1]))


@pytest.mark.parametrize("grad", [[float("nan"), 0.0, 0.0], [0.0, float("inf"), 0.0]])
def test_non_finite_gradients_change_nothing(grad):
    opt, p = _stepped()
    before = _snapshot(opt)
    p.grad = torch.tensor(grad)
    with pytest.raises(NonFiniteStep, match="NaN or inf in 1 of 1 tensors"):
        opt.step(types.AdamParams(learning_rate=0.1))
    _assert_unchanged(opt, before)


def test_overflowing_update_changes_nothing_and_clipping_avoids_it():
    # g = 1e20 is finite in fp32 but g^2 = 1e40 is not: the second moment would become inf and freeze the weight.
    opt, p = _stepped()
    before = _snapshot(opt)
    p.grad = torch.tensor([1e20, 0.0, 0.0])
    with pytest.raises(NonFiniteStep, match="overflows"):
        opt.step(types.AdamParams(learning_rate=0.1))
    _assert_unchanged(opt, before)
    # The gradient norm is computed in float64, so clipping still sees (and tames) the huge gradient.
    metrics = opt.step(types.AdamParams(learning_rate=0.1, grad_clip_norm=1.0))
    assert metrics["grad_norm"] == pytest.approx(1e20, rel=1e-6) and opt.step_count == 2
    assert all(bool(torch.isfinite(t).all()) for t in (p, opt.exp_avg["p"], opt.exp_avg_sq["p"]))


def _bad_states() -> dict[str, tuple[dict[str, torch.Tensor], str]]:
    good = _stepped()[0].state_tensors()
    return {
        "missing": ({k: v for k, v in good.items() if k != "exp_avg.p"}, r"1 missing, e.g. \['exp_avg.p'\]"),
        "extra": ({**good, "exp_avg.q": torch.zeros(3)}, r"1 unexpected, e.g. \['exp_avg.q'\]"),
        "shape": ({**good, "exp_avg.p": torch.zeros(4)}, r"'exp_avg.p' has shape \[4\]"),
        "dtype": ({**good, "exp_avg_sq.p": torch.zeros(3, dtype=torch.float64)}, "dtype torch.float64"),
        "nan": ({**good, "exp_avg.p": torch.tensor([0.0, float("nan"), 0.0])}, "'exp_avg.p' holds NaN or inf"),
        "negative": ({**good, "exp_avg_sq.p": torch.tensor([0.0, -1.0, 0.0])}, "negative"),
        "step": ({**good, "step": torch.tensor([1.5])}, "'step' must be one non-negative integer"),
    }


@pytest.mark.parametrize("case", list(_bad_states()))
def test_invalid_state_is_refused_before_anything_changes(case):
    opt, _ = _stepped()
    before = _snapshot(opt)
    state, message = _bad_states()[case]
    with pytest.raises(InvalidState, match=message):
        opt.load_state_tensors(state)
    _assert_unchanged(opt, before)
