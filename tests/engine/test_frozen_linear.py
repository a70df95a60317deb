"""The frozen base's Linear layers on packed oneDNN weights (``engine/training/frozen_linear.py``): values, input gradients,
fall-back, and a LoRA training step equal to the plain path."""

from __future__ import annotations

import pytest
import torch

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.kernels import onednn
from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.training import frozen_linear
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"
FP32_UNIT = 2.0**-24
BF16_UNIT = 2.0**-9


def _bound(a: torch.Tensor, b: torch.Tensor, unit_input: float, depth: int) -> torch.Tensor:
    """Elementwise error bound of ``a @ b`` computed from inputs rounded with unit ``unit_input``, fp32 sums.

    Each product a_i·b_i carries (1+δa)(1+δb) ≈ 1 + 2·unit_input, each fp32 addition of a length-``depth`` sum
    at most ``FP32_UNIT`` relative (the classic γ_depth bound), and a bf16 result one more bf16 rounding; all
    relative to Σ|a_i||b_i|. The worst case, so it holds for any summation order, blocking or thread count.
    """
    scale = a.abs().double() @ b.abs().double()
    rounding = 3 * unit_input + depth * FP32_UNIT
    return rounding * scale + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_forward_and_input_grad_match_float64(dtype: torch.dtype, bias: bool) -> None:
    if not onednn.can_pack(dtype):
        pytest.skip(f"oneDNN packing for {dtype} is unavailable on this CPU (the fall-back test covers that)")
    generator = torch.Generator().manual_seed(0)
    module = torch.nn.Linear(96, 160, bias=bias).requires_grad_(False)
    x = torch.randn(3, 37, 96, generator=generator, requires_grad=True)
    upstream = torch.randn(3, 37, 160, generator=generator)
    assert frozen_linear.install(module, dtype) > 0
    out = module(x)
    out.backward(upstream)
    assert out.dtype == torch.float32 and x.grad is not None and x.grad.dtype == torch.float32

    unit = FP32_UNIT if dtype == torch.float32 else BF16_UNIT
    weight = module.weight.double()
    reference = x.detach().double() @ weight.T + (module.bias.double() if bias else 0)
    rows = x.detach().reshape(-1, 96)
    bound = _bound(rows, module.weight.T, unit, 96).view(3, 37, 160)
    if bias:  # the bias is one more addend of the sum (rounded to the packed dtype)
        bound = bound + (unit + 97 * FP32_UNIT) * module.bias.abs().double()
    assert bool(((out.detach().double() - reference).abs() <= bound).all())
    grad_reference = upstream.double() @ weight
    grad_bound = _bound(upstream.reshape(-1, 160), module.weight, unit, 160).view(3, 37, 96)
    assert bool(((x.grad.double() - grad_reference).abs() <= grad_bound).all())
    # No gradient for the frozen weight.
    assert module.weight.grad is None


def test_repacks_a_weight_changed_in_place() -> None:
    if not onednn.can_pack(torch.float32):
        pytest.skip("oneDNN fp32 packing is unavailable on this CPU")
    module = torch.nn.Linear(16, 8, bias=False).requires_grad_(False)
    frozen_linear.install(module, torch.float32)
    x = torch.randn(4, 16)
    module(x)
    with torch.no_grad():
        module.weight.mul_(2.0)
    expected = x.double() @ module.weight.double().T
    assert bool(((module(x).double() - expected).abs() <= _bound(x, module.weight.T, FP32_UNIT, 16)).all())


def test_falls_back_when_packing_is_unavailable_or_not_applicable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is installed where the probe failed, on a non-CPU weight, or on a trainable weight; uninstall
    restores F.linear."""
    plain = torch.nn.Linear(8, 4).requires_grad_(False)
    monkeypatch.setitem(onednn._packing_works, torch.float32, False)  # the probe's answer on such a CPU
    assert frozen_linear.install(plain, torch.float32) == 0
    assert "forward" not in plain.__dict__
    monkeypatch.undo()

    with torch.device("meta"):
        elsewhere = torch.nn.Linear(8, 4).requires_grad_(False)
    trainable = torch.nn.Linear(8, 4)
    assert frozen_linear.install(elsewhere, torch.float32) == 0
    assert frozen_linear.install(trainable, torch.float32) == 0
    assert "forward" not in elsewhere.__dict__ and "forward" not in trainable.__dict__

    if onednn.can_pack(torch.float32):
        frozen = torch.nn.Linear(8, 4).requires_grad_(False)
        frozen_linear.install(frozen, torch.float32)
        assert "forward" in frozen.__dict__
        frozen_linear.uninstall(frozen)
        assert "forward" not in frozen.__dict__ and "_tinker_packed" not in frozen.__dict__
        x = torch.randn(2, 8)
        assert torch.equal(frozen(x), torch.nn.functional.linear(x, frozen.weight, frozen.bias))


def _session(packed: bool, monkeypatch: pytest.MonkeyPatch) -> TrainingSession:
    monkeypatch.setattr(settings, "PACK_FP32_BASE", packed)
    base = BaseModel(get_model_spec(MODEL), load_model(MODEL, torch.float32), torch.float32)
    assert (base.packed_bytes > 0) == (packed and onednn.can_pack(torch.float32))
    return TrainingSession(f"packed-{packed}", base, types.LoraConfig(rank=8, seed=5))


def _data() -> list[types.Datum]:
    generator = torch.Generator().manual_seed(2)
    rows = [torch.randint(10, 1000, (n,), generator=generator).tolist() for n in (9, 40, 41)]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(r[:-1]),
            loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * (len(r) - 1)},
        )
        for r in rows
    ]


def _logprobs(output: types.ForwardBackwardOutput) -> torch.Tensor:
    return torch.cat([torch.tensor(o["logprobs"].tolist(), dtype=torch.float64) for o in output.loss_fn_outputs])


def test_lora_step_on_packed_fp32_base_equals_the_plain_path(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same logprobs, LoRA gradients and post-step logprobs as F.linear, to fp32 summation-order rounding.

    The two paths differ only in the order of fp32 sums (~1e-7 relative per matmul); through a 2-layer model and a
    log-softmax that stays around 1e-6 in logprobs and gradients, so 1e-4 (the sampler/learner agreement bound)
    in logprobs and 1e-4 of the gradient's norm leave a wide margin and still catch any real difference (a wrong
    transpose or bf16 rounding gives >= 1e-3).
    """
    if device != "cpu":
        pytest.skip("packing is a CPU path; other devices never install it")
    plain, packed = _session(False, monkeypatch), _session(True, monkeypatch)
    data = _data()
    outputs = [s.forward(data, "cross_entropy", None, backward=True) for s in (plain, packed)]
    assert float((_logprobs(outputs[0]) - _logprobs(outputs[1])).abs().max()) < 1e-4
    for key, p in plain.params.items():
        q = packed.params[key]
        assert p.grad is not None and q.grad is not None
        assert float((p.grad - q.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-12, key
    for s in (plain, packed):
        s.optim_step(types.AdamParams(learning_rate=1e-3))
    after = [_logprobs(s.forward(data, "cross_entropy", None, backward=False)) for s in (plain, packed)]
    assert float((after[0] - after[1]).abs().max()) < 1e-4
    assert float((after[0] - _logprobs(outputs[0])).abs().max()) > 1e-3  # the step changed the model
