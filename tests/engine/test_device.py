"""The engine's device and precision choices: resolution, the bf16 frozen-base mode, the fp32 matmul routing."""

from __future__ import annotations

import pytest
import torch

from tinker_cookbook.engine import device as engine_device
from tinker_cookbook.engine import settings
from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

MODEL = "tinker-cookbook/tiny-smollm2"


def test_device_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.DEVICE_ENV, "cpu")
    assert engine_device.engine_device() == torch.device("cpu")
    assert engine_device.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(BadRequestError, match="tpu"):
        engine_device.resolve_device("tpu")
    monkeypatch.setenv(settings.DEVICE_ENV, "no-such-device")
    with pytest.raises(BadRequestError, match=r"\$TINKER_COOKBOOK_DEVICE='no-such-device'"):
        engine_device.engine_device()
    if not torch.cuda.is_available():
        with pytest.raises(BadRequestError, match="no CUDA GPU"):
            engine_device.resolve_device("cuda")


def test_base_dtype_and_announcement(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(settings.TRAIN_DTYPE_ENV, raising=False)
    assert engine_device.base_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setenv(settings.TRAIN_DTYPE_ENV, "bf16")
    assert engine_device.base_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv(settings.TRAIN_DTYPE_ENV, "int8")
    with pytest.raises(BadRequestError, match="int8"):
        engine_device.base_dtype(torch.device("cpu"))
    engine_device.announce(torch.device("cpu"), torch.bfloat16, torch.float32)
    engine_device.announce(torch.device("cpu"), torch.bfloat16, torch.float32)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tinker_cookbook engine")]
    assert len(lines) == 1 and "device cpu" in lines[0] and "base weights bf16" in lines[0]


def test_fast_fp32_matmuls_keep_fp32_precision_and_restore_the_switch() -> None:
    """Inside the block fp32 matmuls match an fp64 reference to fp32 rounding (a bf16 path would be off by ~1e-3,
    which the probe excludes); the process-wide switch is back to its value afterwards."""
    matmul = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]
    before = matmul.fp32_precision
    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 700, generator=generator), torch.randn(700, 200, generator=generator)
    with engine_device.fast_fp32_matmuls(torch.device("cpu")):
        product = a @ b
    reference = a.double() @ b.double()
    assert float((product.double() - reference).abs().max() / reference.abs().max()) < 1e-5
    assert matmul.fp32_precision == before


def _session(compute: torch.dtype, device: str) -> TrainingSession:
    model = load_model(MODEL, torch.float32)
    torch.nn.Module.to(model, torch.device(device))
    base = BaseModel(get_model_spec(MODEL), model, compute)
    return TrainingSession(f"run-{str(compute).removeprefix('torch.')}", base, types.LoraConfig(rank=4, seed=3))


def _data(seed: int) -> list[types.Datum]:
    generator = torch.Generator().manual_seed(seed)
    rows = [torch.randint(10, 1000, (n,), generator=generator).tolist() for n in (12, 30)]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(r[:-1]),
            loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * (len(r) - 1)},
        )
        for r in rows
    ]


def test_bf16_base_trains_fp32_lora_and_stays_near_fp32(device: str) -> None:
    """bf16 frozen base: LoRA parameters, their gradients and Adam's state stay fp32, and the forward's logprobs
    stay near the fp32 base's. bf16 rounds each matmul input to 8 significant bits (relative 2^-9); on this
    2-layer model that moves logprobs by ~2e-4 on average (measured), bounded here by 0.02. They must differ,
    though: otherwise the bf16 path did not run."""
    fp32, bf16 = _session(torch.float32, device), _session(torch.bfloat16, device)
    data = _data(0)
    reference = fp32.forward(data, "cross_entropy", None, backward=False)
    low = bf16.forward(data, "cross_entropy", None, backward=True)
    delta = torch.cat([
        torch.tensor(a["logprobs"].tolist()) - torch.tensor(b["logprobs"].tolist())
        for a, b in zip(low.loss_fn_outputs, reference.loss_fn_outputs, strict=True)
    ]).abs()  # fmt: skip
    assert 0 < float(delta.mean()) <= 0.02
    bf16.optim_step(types.AdamParams(learning_rate=1e-3))
    assert all(p.dtype == torch.float32 for p in bf16.params.values())
    state = bf16.optimizer.state_tensors()
    assert all(t.dtype == torch.float32 for k, t in state.items() if k != "step")
