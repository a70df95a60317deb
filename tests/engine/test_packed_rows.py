"""Length groups of long rows run packed end to end, without padding (``passes.packable``, ``passes.packed_hidden``,
``fused_layers.packed_rows``): the same logprobs and LoRA gradients as the right-padded batch, to fp32 rounding."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from tiny_sessions import TINY_MODEL, lora_session, random_datums

from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.training import fused_layers, passes
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types

LENGTHS = (300, 260, 140, 131, 40, 30)
"""Two long groups of unequal rows (packed) and one short group (padded, as before), by ``passes.length_groups``."""


def test_only_groups_of_unequal_long_rows_are_packed() -> None:
    long = passes.PACK_MIN_ROW_TOKENS
    assert passes.packable([long, long + 1])
    assert not passes.packable([long - 1, long + 50])  # a short row: the padded batch serves its attention better
    assert not passes.packable([long + 5, long + 5])  # equal rows: nothing is padded
    assert not passes.packable([long + 50])


def _run(model: str, backward: bool = True) -> tuple[types.ForwardBackwardOutput, TrainingSession]:
    session = lora_session("packed", model)
    return session.forward(random_datums(LENGTHS, seed=5, mean=True), "cross_entropy", None, backward=backward), session


def _assert_same(a: tuple[types.ForwardBackwardOutput, TrainingSession],
                 b: tuple[types.ForwardBackwardOutput, TrainingSession]) -> None:
    """Same function in fp32; the matmuls see other row counts (no padding rows) and attention runs per row, so
    only summation order differs: ~1e-6 in logprobs through 2 layers and a vocabulary-wide log-softmax. 1e-4 (the
    sampler/learner agreement bound) and 1e-4 of each gradient's norm leave margin; attending across two packed
    rows, or a position counted from the wrong start, moves logprobs by > 1e-2."""
    for x, y in zip(a[0].loss_fn_outputs, b[0].loss_fn_outputs, strict=True):
        assert float((x["logprobs"].to_torch() - y["logprobs"].to_torch()).abs().max()) < 1e-4
    assert sum(float(p.grad.norm()) for p in a[1].params.values() if p.grad is not None) > 0
    for key, p in a[1].params.items():
        q = b[1].params[key]
        assert p.grad is not None and q.grad is not None
        assert float((p.grad - q.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-12, key


@pytest.fixture
def packed_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The row lengths of every packed pass."""
    calls: list[tuple[int, ...]] = []
    original = passes.packed_hidden

    def spy(model: object, rows: list[torch.Tensor]) -> torch.Tensor:
        calls.append(tuple(len(r) for r in rows))
        return original(model, rows)

    monkeypatch.setattr(passes, "packed_hidden", spy)
    return calls


@pytest.mark.parametrize("model", [TINY_MODEL, "tinker-cookbook/tiny-qwen3"])
def test_a_packed_pass_equals_the_padded_one(model: str, packed_calls: list[tuple[int, ...]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    packed = _run(model)
    assert sorted(tuple(sorted(c)) for c in packed_calls) == [(131, 140), (260, 300)]
    monkeypatch.setattr(passes, "packable", lambda lengths: False)
    _assert_same(packed, _run(model))


def test_each_packed_row_attends_only_to_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused attention's row-by-row path against transformers' own reading of the packed positions (its
    block-diagonal mask, run by the fused attention's masked path): the two ways a packed pass can go agree."""
    calls = {"rows": 0}
    original = fused_layers._AttentionFunction.apply

    def counting(*args: object) -> torch.Tensor:
        calls["rows"] += args[3] is None  # type: ignore[operator]  # a causal call, no mask: one packed row
        return original(*args)

    monkeypatch.setattr(fused_layers._AttentionFunction, "apply", counting)
    row_by_row = _run(TINY_MODEL)
    layers = row_by_row[1].base._model.config.num_hidden_layers
    assert calls["rows"] >= 4 * layers  # the four packed rows, in every layer

    @contextlib.contextmanager
    def ignored(lengths: object) -> Iterator[None]:
        yield

    monkeypatch.setattr(fused_layers, "packed_rows", ignored)
    _assert_same(row_by_row, _run(TINY_MODEL))


def test_rows_are_not_packed_where_the_fused_attention_is_not_installed(packed_calls: list[tuple[int, ...]],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tinker_cookbook.engine import settings

    monkeypatch.setattr(settings, "FUSED_LAYERS", False)
    _, session = _run(TINY_MODEL, backward=False)
    assert not session.base.packs_rows and packed_calls == []


def test_rows_are_not_packed_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 base without packed bf16 weights runs under autocast: bf16 activations, which the fused attention
    leaves to SDPA, where the packed mask would cost more than the padding."""
    from tinker_cookbook.engine.kernels import onednn

    monkeypatch.setattr(onednn, "can_pack", lambda dtype: dtype == torch.float32)
    base = BaseModel(get_model_spec(TINY_MODEL), load_model(TINY_MODEL, torch.float32), torch.bfloat16)
    assert base.packed_bytes == 0 and not base.packs_rows
    assert BaseModel(get_model_spec(TINY_MODEL), load_model(TINY_MODEL, torch.float32), torch.float32).packs_rows
