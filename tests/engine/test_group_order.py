"""The order in which one client's training pass runs its length groups: largest first (``passes.largest_first``),
so that the largest group sets the heap's high-water mark once; each datum's result does not depend on it."""

from __future__ import annotations

import pytest
import torch
from tiny_sessions import lora_session, random_datums

from tinker_cookbook.engine.training import passes

LENGTHS = (41, 9, 300, 120, 40)
"""Four length groups (``passes.length_groups``): 9 | 40, 41 | 120 | 300 tokens, padded sizes 9, 82, 120, 300."""


def test_a_single_client_pass_runs_its_largest_group_first(group_sizes: list[int]) -> None:
    lora_session("order").forward(random_datums(LENGTHS, seed=7), "cross_entropy", None, backward=True)
    assert group_sizes == [300, 120, 82, 9]


def test_the_group_order_changes_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Largest first against length order (what ran before): each datum's logprobs are computed by the same ops
    on the same rows, so they are equal bit for bit; the LoRA gradients sum the groups' contributions in another
    order, so they differ by fp32 rounding of that sum (a few ulps of the largest contribution: 1e-6 of the norm;
    a group missing or counted twice moves them by far more)."""
    data = random_datums(LENGTHS, seed=7)
    largest = lora_session("order")
    out_largest = largest.forward(data, "cross_entropy", None, backward=True)
    monkeypatch.setattr(passes, "largest_first", lambda groups, lengths: groups)
    in_order = lora_session("order")
    out_in_order = in_order.forward(data, "cross_entropy", None, backward=True)
    for a, b in zip(out_largest.loss_fn_outputs, out_in_order.loss_fn_outputs, strict=True):
        assert torch.equal(a["logprobs"].to_torch(), b["logprobs"].to_torch())
    for key, p in largest.params.items():
        q = in_order.params[key]
        assert p.grad is not None and q.grad is not None
        assert float((p.grad - q.grad).norm()) <= 1e-6 * float(p.grad.norm()) + 1e-12, key
