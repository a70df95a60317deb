"""Where the engine computes: one device for the base models, training and the sampler.

``$TINKER_COOKBOOK_DEVICE`` chooses it: ``auto`` (the default: the first CUDA GPU when torch sees one, else the
CPU), ``cpu``, ``cuda`` or ``cuda:N``. ``LocalBackend(device=...)`` overrides it for one engine. The engine says
once, on stderr, what it chose (``announce``).

Precision per device (one place, read by training and the sampler):

- CPU: the frozen base in fp32, its matmuls through oneDNN's fp32 kernels where a probe shows that is exact
  (``fast_fp32_matmuls``; the base's Linear layers on weights packed once for oneDNN, ``frozen_linear``: ``W``
  for the forward, ``Wᵀ`` for the input gradient). ``$TINKER_COOKBOOK_TRAIN_DTYPE=bf16`` packs those copies in
  bf16 where the CPU has bf16 kernels (``kernels.onednn.can_pack``; elsewhere autocast), so only the base's Linear
  matmuls run in bf16: activations, attention, the logits and everything LoRA stay fp32; the logprob mismatch
  that adds, and its speed, are in docs/performance.md. LoRA parameters, gradients and Adam state in fp32; the sampler in
  fp32 (see ``default_sampling_dtype``).
- CUDA: the frozen base's matmuls in bf16 (autocast: bf16 tensor cores; weights stored fp32), LoRA parameters, gradients and Adam state in fp32,
  the sampler in bf16 with its K/V cache on the GPU.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from tinker_cookbook.engine import settings
from tinker_cookbook.tinker.errors import BadRequestError

_TRAIN_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
_announced: set[str] = set()
_announce_lock = threading.Lock()


def resolve_device(value: str | torch.device | None = None) -> torch.device:
    """The device for ``value`` (``None``: ``$TINKER_COOKBOOK_DEVICE``, else ``auto``); BadRequestError if unusable."""
    if isinstance(value, torch.device):
        text = str(value)
    else:
        text = (value.strip().lower() or "auto") if value is not None else settings.device()
    where = f"device={value!r}" if value is not None else f"${settings.DEVICE_ENV}={text!r}"
    if text == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise BadRequestError(f"{where} is not a device; use auto, cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise BadRequestError(f"{where}: the engine runs on cpu or cuda, not {device.type}; use auto, cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BadRequestError(f"{where} but torch sees no CUDA GPU; use cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BadRequestError(
                f"{where} but torch sees {torch.cuda.device_count()} GPU(s); use cuda:0..{torch.cuda.device_count() - 1}"
            )
    return device


def engine_device() -> torch.device:
    """The device of the process-wide engine (``$TINKER_COOKBOOK_DEVICE``, default auto)."""
    return resolve_device(None)


def base_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the frozen base weights that training runs on ``device``.

    bf16 on CUDA; on CPU fp32 unless ``$TINKER_COOKBOOK_TRAIN_DTYPE=bf16``. LoRA parameters, gradients and the
    optimizer state are fp32 everywhere.
    """
    value = settings.train_dtype()
    if value:
        if value not in _TRAIN_DTYPES:
            raise BadRequestError(f"${settings.TRAIN_DTYPE_ENV}={value!r} is not a training dtype; use fp32 or bf16")
        return _TRAIN_DTYPES[value]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


_onednn_fp32: bool | None = None


def _onednn_fp32_is_exact() -> bool:
    """Whether fp32 matmuls routed to oneDNN (torch's ``bf16`` fp32-precision switch) keep fp32 precision here.

    torch sends fp32 matmuls to its BLAS unless that switch allows oneDNN a reduced precision. On CPUs without AMX
    (checked on AMD EPYC with AVX512-BF16) oneDNN then runs its own fp32 AVX-512 kernels, exact to fp32 and 2x
    faster than a BLAS that takes a narrower code path there; where it would really round to bf16 (AMX), the
    probe sees bf16-sized errors and the switch is never used. Checked once, on a realistic shape.
    """
    global _onednn_fp32
    if _onednn_fp32 is None:
        matmul: Any = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]  # not in the stubs
        before = matmul.fp32_precision
        try:
            generator = torch.Generator().manual_seed(0)
            a = torch.randn(256, 1024, generator=generator)
            b = torch.randn(1024, 512, generator=generator)
            reference = a.double() @ b.double()
            matmul.fp32_precision = "bf16"
            error = float(((a @ b).double() - reference).abs().max() / reference.abs().max())
            _onednn_fp32 = error < 1e-5  # fp32 summation: ~1e-6; bf16 inputs: ~1e-3
        except Exception:  # noqa: BLE001 - no oneDNN or no such switch: keep the BLAS
            _onednn_fp32 = False
        finally:
            matmul.fp32_precision = before
    return _onednn_fp32


@contextlib.contextmanager
def fast_fp32_matmuls(device: torch.device) -> Iterator[None]:
    """Route fp32 matmuls on the CPU to oneDNN inside the block where that is exact (``_onednn_fp32_is_exact``).

    The switch is process-wide: other threads' fp32 matmuls take the same (verified exact) kernels meanwhile.
    """
    if device.type != "cpu" or not settings.compiled() or not _onednn_fp32_is_exact():
        yield
        return
    matmul: Any = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]  # not in the stubs
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def describe(device: torch.device, train_dtype: torch.dtype, sample_dtype: torch.dtype) -> str:
    """One line naming the device and the precision of each part."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = f"{device.type}:{index} ({torch.cuda.get_device_name(index)})"
    else:
        where = f"cpu ({torch.get_num_threads()} torch threads)"
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    return (
        f"tinker_cookbook engine: device {where}; training: base weights {name[train_dtype]}, LoRA and Adam fp32; "
        f"sampler: {name[sample_dtype]} (set ${settings.DEVICE_ENV}, ${settings.TRAIN_DTYPE_ENV}, ${settings.SAMPLER_DTYPE_ENV} "
        "to change)"
    )


def announce(device: torch.device, train_dtype: torch.dtype, sample_dtype: torch.dtype) -> None:
    """Print ``describe(...)`` on stderr, once per process for each distinct choice."""
    line = describe(device, train_dtype, sample_dtype)
    with _announce_lock:
        if line in _announced:
            return
        _announced.add(line)
    print(line, file=sys.stderr, flush=True)
