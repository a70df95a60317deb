"""Where the engine computes: one device for the base models, training and the sampler.

``$TINKER_COOKBOOK_DEVICE`` chooses it: ``auto`` (the default: the first CUDA GPU when torch sees one, else the
CPU), ``cpu``, ``cuda`` or ``cuda:N``. ``LocalBackend(device=...)`` overrides it for one engine. The engine says
once, on stderr, what it chose (``announce``).

Precision per device (one place, read by training and the sampler):

- CPU: the frozen base in fp32 (``$TINKER_COOKBOOK_TRAIN_DTYPE=bf16`` stores it in bf16 for CPUs with bf16 matrix
  units), LoRA parameters, gradients and Adam state in fp32; the sampler in fp32 (see ``default_sampling_dtype``).
- CUDA: the frozen base in bf16 (bf16 tensor-core matmuls), LoRA parameters, gradients and Adam state in fp32,
  the sampler in bf16 with its K/V cache on the GPU.
"""

from __future__ import annotations

import os
import sys
import threading

import torch

from tinker_cookbook.tinker.errors import BadRequestError

DEVICE_ENV = "TINKER_COOKBOOK_DEVICE"
TRAIN_DTYPE_ENV = "TINKER_COOKBOOK_TRAIN_DTYPE"
_TRAIN_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
_announced: set[str] = set()
_announce_lock = threading.Lock()


def resolve_device(value: str | torch.device | None = None) -> torch.device:
    """The device for ``value`` (``None``: ``$TINKER_COOKBOOK_DEVICE``, else ``auto``); BadRequestError if unusable."""
    if isinstance(value, torch.device):
        text = str(value)
    else:
        text = (value if value is not None else os.environ.get(DEVICE_ENV, "")).strip().lower() or "auto"
    where = f"device={value!r}" if value is not None else f"${DEVICE_ENV}={text!r}"
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
    value = os.environ.get(TRAIN_DTYPE_ENV, "").strip().lower()
    if value:
        if value not in _TRAIN_DTYPES:
            raise BadRequestError(f"${TRAIN_DTYPE_ENV}={value!r} is not a training dtype; use fp32 or bf16")
        return _TRAIN_DTYPES[value]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


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
        f"sampler: {name[sample_dtype]} (set ${DEVICE_ENV}, ${TRAIN_DTYPE_ENV}, $TINKER_COOKBOOK_SAMPLER_DTYPE "
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
