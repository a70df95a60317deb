"""oneDNN's pre-packed weight matmuls on the CPU (private torch ops), probed before use.

``pack`` re-lays a weight out once in oneDNN's blocked layout; ``packed_matmul`` multiplies by it. Both go through
``torch.ops.mkldnn`` ops that are private to torch: a build without them (or without bf16 kernels) must still
import and run, so the op is bound once under a guard (``LINEAR_POINTWISE``, None when missing) and ``can_pack``
probes each dtype on a tiny matmul before anyone packs. Training's frozen base (``training.frozen_linear``) and the
sampler's weights (``sampling.decoder_model.Linear``) use them; ``$TINKER_COOKBOOK_COMPILED=0`` turns them off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tinker_cookbook.engine import settings

PACK_BATCH_HINT = 128
"""oneDNN picks its blocking from an expected row count; training passes run hundreds to thousands of rows."""


def _bind(name: str) -> Callable[..., Any] | None:
    """The default overload of ``torch.ops.mkldnn.<name>``, or None where this torch build lacks it."""
    try:
        return getattr(torch.ops.mkldnn, name).default
    except (AttributeError, RuntimeError):
        return None


# The overload itself: calling it skips the packet's overload resolution on each of a decode step's ~120 calls.
LINEAR_POINTWISE = _bind("_linear_pointwise")
_REORDER_LINEAR_WEIGHT = _bind("_reorder_linear_weight")

_packing_works: dict[torch.dtype, bool] = {}


def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN weight pre-packing works here for ``dtype`` (checked once per dtype, on a tiny matmul), and
    compiled paths are on.

    fp32 must agree with F.linear to fp32 summation-order rounding; bf16 (bf16 inputs, fp32 accumulation) to
    F.linear run on the same bf16 inputs within bf16 output rounding.
    """
    if not settings.compiled() or LINEAR_POINTWISE is None or _REORDER_LINEAR_WEIGHT is None:
        return False
    if dtype not in _packing_works:
        try:
            generator = torch.Generator().manual_seed(0)
            weight = torch.randn(48, 32, generator=generator).to(dtype)
            x = torch.randn(5, 32, generator=generator).to(dtype)
            out = packed_matmul(x, pack(weight, dtype)).double()
            reference = x.double() @ weight.double().T
            # 32 products of unit-variance numbers: |reference| ~ 6; fp32 summation errs by ~1e-6 of that, a bf16
            # result by ~4e-3 relative (8 mantissa bits).
            tolerance = 1e-4 if dtype == torch.float32 else 2e-2 * float(reference.abs().max())
            _packing_works[dtype] = bool((out - reference).abs().max() <= tolerance)
        except Exception:  # noqa: BLE001 - any failure (no oneDNN, no bf16 kernels) means: keep F.linear
            _packing_works[dtype] = False
    return _packing_works[dtype]


def pack(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight [out, in]`` in ``dtype``, re-laid out for ``packed_matmul`` (only after ``can_pack(dtype)``)."""
    assert _REORDER_LINEAR_WEIGHT is not None, "pack() called where can_pack() is False"
    return _REORDER_LINEAR_WEIGHT(weight.detach().to(dtype).contiguous(), PACK_BATCH_HINT)


def packed_rows(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Contiguous ``rows [n, in]`` (in ``packed``'s dtype) ``@ Wᵀ (+ bias)`` for ``packed = pack(W)``."""
    assert LINEAR_POINTWISE is not None, "packed_rows() called where can_pack() is False"
    return LINEAR_POINTWISE(rows, packed, bias, "none", [None], "")


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., in] @ Wᵀ (+ bias)`` for ``packed = pack(W)``, in ``packed``'s dtype (``x`` cast to it)."""
    rows = x.reshape(-1, x.shape[-1]).to(packed.dtype).contiguous()
    out = packed_rows(rows, packed, bias)
    return out.view(*x.shape[:-1], out.shape[-1])
