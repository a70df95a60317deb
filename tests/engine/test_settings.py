"""The engine's settings: every environment variable read in ``engine.settings``, the one switch that turns every
compiled path off, and the guard that lets a torch without oneDNN's private ops fall back instead of failing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.device import fast_fp32_matmuls
from tinker_cookbook.engine.kernels import decode_kernel, onednn
from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.sampling.decoder_model import Linear
from tinker_cookbook.engine.training import frozen_linear
from tinker_cookbook.engine.training.base_model import BaseModel
from tinker_cookbook.tinker.errors import BadRequestError

ENGINE = Path(settings.__file__).parent
MODEL = "tinker-cookbook/tiny-smollm2"


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = [str(path.relative_to(ENGINE)) for path in sorted(ENGINE.rglob("*.py"))
               if path.name != "settings.py" and ("os.environ" in path.read_text() or "getenv" in path.read_text())]
    assert readers == []


def test_the_compiled_switch_turns_every_compiled_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.COMPILED_ENV, "0")
    assert not settings.compiled() and not settings.decode_kernel() and not settings.pack_fp32_base()
    assert not decode_kernel.enabled()
    assert not onednn.can_pack(torch.float32) and not onednn.can_pack(torch.bfloat16)
    assert frozen_linear.install(torch.nn.Linear(8, 4).requires_grad_(False), torch.float32) == 0
    linear = Linear.of(torch.randn(4, 8), None)
    assert not linear.packed and linear.blocked is None
    matmul = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]
    before = matmul.fp32_precision
    with fast_fp32_matmuls(torch.device("cpu")):
        assert matmul.fp32_precision == before  # torch's own fp32 matmuls
    base = BaseModel(get_model_spec(MODEL), load_model(MODEL, torch.float32), torch.float32)
    assert base.packed_bytes == 0
    monkeypatch.setenv(settings.COMPILED_ENV, "1")
    assert settings.compiled() and settings.pack_fp32_base() == settings.PACK_FP32_BASE


def test_switch_values_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.COMPILED_ENV, "no")
    with pytest.raises(BadRequestError, match=r"\$TINKER_COOKBOOK_COMPILED='no' is not valid; set it to 1"):
        settings.compiled()
    with pytest.raises(BadRequestError, match="TINKER_COOKBOOK_COMPILED"):
        decode_kernel.enabled()  # the kernel's own switch is on, but it obeys the global one


def test_a_torch_without_the_private_op_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert onednn._bind("no_such_op_in_any_torch") is None
    monkeypatch.setattr(onednn, "LINEAR_POINTWISE", None)
    assert not onednn.can_pack(torch.float32)
    module = torch.nn.Linear(8, 4).requires_grad_(False)
    assert frozen_linear.install(module, torch.float32) == 0
    weight = torch.randn(4, 8)
    linear = Linear.of(weight, None)
    x = torch.randn(2, 8)
    assert not linear.packed and torch.equal(linear(x), F.linear(x, weight))
