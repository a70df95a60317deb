"""The order in which one client's training pass runs its length groups: largest first (``passes.largest_first``),
so that the largest group sets the heap's high-water mark once; each datum's result does not depend on it."""

from __future__ import annotations

import pytest
import torch

from tinker_cookbook.engine import passes
from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.training import BaseModel, TrainingSession
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"
LENGTHS = (41, 9, 300, 120, 40)
"""Four length groups (``passes.length_groups``): 9 | 40, 41 | 120 | 300 tokens, padded sizes 9, 82, 120, 300."""


def _session() -> TrainingSession:
    base = BaseModel(get_model_spec(MODEL), load_model(MODEL, torch.float32), torch.float32)
    return TrainingSession("order", base, types.LoraConfig(rank=4, seed=3, train_unembed=True))


def _data() -> list[types.Datum]:
    generator = torch.Generator().manual_seed(7)
    rows = [torch.randint(10, 1000, (n + 1,), generator=generator).tolist() for n in LENGTHS]
    return [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                        loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * (len(r) - 1)}) for r in rows]


def test_a_single_client_pass_runs_its_largest_group_first(group_sizes: list[int]) -> None:
    _session().forward(_data(), "cross_entropy", None, backward=True)
    assert group_sizes == [300, 120, 82, 9]


def test_the_group_order_changes_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Largest first against length order (what ran before): each datum's logprobs are computed by the same ops
    on the same rows, so they are equal bit for bit; the LoRA gradients sum the groups' contributions in another
    order, so they differ by fp32 rounding of that sum (a few ulps of the largest contribution: 1e-6 of the norm;
    a group missing or counted twice moves them by far more)."""
    data = _data()
    largest = _session()
    out_largest = largest.forward(data, "cross_entropy", None, backward=True)
    monkeypatch.setattr(passes, "largest_first", lambda groups, lengths: groups)
    in_order = _session()
    out_in_order = in_order.forward(data, "cross_entropy", None, backward=True)
    for a, b in zip(out_largest.loss_fn_outputs, out_in_order.loss_fn_outputs, strict=True):
        assert torch.equal(a["logprobs"].to_torch(), b["logprobs"].to_torch())
    for key, p in largest.params.items():
        q = in_order.params[key]
        assert p.grad is not None and q.grad is not None
        assert float((p.grad - q.grad).norm()) <= 1e-6 * float(p.grad.norm()) + 1e-12, key
