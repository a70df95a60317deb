"""The head's log-softmax of the target tokens (``passes.TargetLogprobs``) against float64 autograd."""

from __future__ import annotations

import pytest
import torch

from tinker_cookbook.engine.training.passes import TargetLogprobs


@pytest.mark.parametrize("candidates", [1, 3])
def test_target_logprobs_and_gradient_match_float64_autograd(candidates: int) -> None:
    """Values and d/dlogits to fp32 rounding. Logits of size ~10 (up to ~45) over a vocabulary of 5000: the
    log-sum-exp and the difference carry a few fp32 ulps of ~45 (ulp 4e-6), so 1e-4 absolute; softmax · sum(g) and
    the scattered g carry ~1e-7 of the largest gradient entry, so 1e-5 of it bounds both with margin. Duplicate
    candidates must add up (a plain scatter would drop one)."""
    generator = torch.Generator().manual_seed(4)
    logits = (10 * torch.randn(33, 5000, generator=generator)).requires_grad_(True)
    index = torch.randint(0, 5000, (33, candidates), generator=generator)
    if candidates > 1:
        index[:, 1] = index[:, 0]  # a repeated candidate
    upstream = torch.randn(33, candidates, generator=generator)

    logp = TargetLogprobs.apply(logits, index)
    logp.backward(upstream)
    wide = logits.detach().double().requires_grad_(True)
    reference = wide.gather(-1, index) - torch.logsumexp(wide, dim=-1, keepdim=True)
    reference.backward(upstream.double())

    assert logp.dtype == torch.float32 and logits.grad is not None
    assert float((logp.detach().double() - reference.detach()).abs().max()) < 1e-4
    assert wide.grad is not None
    scale = float(wide.grad.abs().max())
    assert float((logits.grad.double() - wide.grad).abs().max()) < 1e-5 * scale
