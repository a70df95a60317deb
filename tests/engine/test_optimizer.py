"""AdamW against a hand-computed first step and against torch.optim.AdamW over several steps."""

import pytest
import torch

from tinker_cookbook.engine.optimizer import AdamW
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
