"""Every knob of the engine, read in one place.

Environment variables are read at each call (a test or a long-lived process may change them); the two module
constants are switches for code that builds the engine in Python (tests, benchmarks) rather than for users.

=========================  ================================  ==============  =================================================
Knob                       Environment variable              Default         Meaning
=========================  ================================  ==============  =================================================
``device()``               ``TINKER_COOKBOOK_DEVICE``        ``auto``        where models, training and sampling run: ``auto``
                                                                             (a CUDA GPU when torch sees one, else the CPU),
                                                                             ``cpu``, ``cuda`` or ``cuda:N``
``train_dtype()``          ``TINKER_COOKBOOK_TRAIN_DTYPE``   per device      the frozen base's matmul precision in training:
                                                                             ``fp32`` (CPU default) or ``bf16`` (GPU default)
``sampler_dtype()``        ``TINKER_COOKBOOK_SAMPLER_DTYPE`` per device      the sampler's weights: ``fp32`` (CPU default) or
                                                                             ``bf16`` (GPU default)
``sampler_lora()``         ``TINKER_COOKBOOK_SAMPLER_LORA``  ``auto``        LoRA snapshots merged into a weight copy
                                                                             (``merged``), added per row on the shared base
                                                                             (``unmerged``), or chosen by size (``auto``)
``model_path()``           ``TINKER_COOKBOOK_MODEL_PATH``    ``auto``        how text models train and sample: ``auto`` (the
                                                                             fast fused paths for Llama/Qwen2/Qwen3, the
                                                                             general transformers path for every other
                                                                             causal LM) or ``general`` (every text model on
                                                                             the general path)
``compiled()``             ``TINKER_COOKBOOK_COMPILED``      ``1``           ``0`` turns every compiled path off (plain torch
                                                                             kernels everywhere): the C decode kernel, the
                                                                             oneDNN pre-packed weights of training and
                                                                             sampling, and oneDNN's fp32 matmul routing
``decode_kernel()``        ``TINKER_COOKBOOK_DECODE_KERNEL`` ``1``           ``0`` turns off the C decode kernel alone (the
                                                                             sampler's decode step and its small matmuls)
``c_compiler()``           ``CC``                            ``cc``          the C compiler that builds the decode kernel
                                                                             (then ``gcc``, ``clang``)
``store_home()``           ``TINKER_COOKBOOK_HOME``          ``~/.tinker_    the checkpoint store's root
                                                             cookbook``
``PACK_FP32_BASE``         (constant)                        ``True``        the fp32 base's Linear layers also run on packed
                                                                             oneDNN weights on the CPU (bf16 ones always do):
                                                                             +8% tokens/s on SmolLM2-135M for +0.84 GB RSS
``FUSED_LAYERS``           (constant)                        ``True``        on the CPU the decoder's RMSNorms, SiLU MLPs,
                                                                             rotary embeddings and attention run as the
                                                                             hand-fused autograd functions of ``fused_layers``
                                                                             (same values to fp32 rounding, less memory)
=========================  ================================  ==============  =================================================

Boolean variables take ``1`` or ``0``; any other value is refused with an error that names the variable. The
cache of converted models and compiled kernels (``TINKER_COOKBOOK_CACHE``) is read by
``tinker_cookbook.base.assets``, shared with the cookbook.
"""

from __future__ import annotations

import os
from pathlib import Path

from tinker_cookbook.tinker.errors import BadRequestError

DEVICE_ENV = "TINKER_COOKBOOK_DEVICE"
TRAIN_DTYPE_ENV = "TINKER_COOKBOOK_TRAIN_DTYPE"
SAMPLER_DTYPE_ENV = "TINKER_COOKBOOK_SAMPLER_DTYPE"
SAMPLER_LORA_ENV = "TINKER_COOKBOOK_SAMPLER_LORA"
MODEL_PATH_ENV = "TINKER_COOKBOOK_MODEL_PATH"
MODEL_PATHS = ("auto", "general")
COMPILED_ENV = "TINKER_COOKBOOK_COMPILED"
DECODE_KERNEL_ENV = "TINKER_COOKBOOK_DECODE_KERNEL"
COMPILER_ENV = "CC"
HOME_ENV = "TINKER_COOKBOOK_HOME"

PACK_FP32_BASE = True
"""See the table above; set False to trade the packed fp32 base's speed for memory."""
FUSED_LAYERS = True
"""See the table above."""


def _text(name: str) -> str:
    """The variable's value, stripped and lower-cased ("" when unset)."""
    return os.environ.get(name, "").strip().lower()


def _switch(name: str, on: str, off: str) -> bool:
    """A 1/0 variable, on when unset; another value is a BadRequestError naming it and both meanings."""
    value = os.environ.get(name, "1").strip()
    if value not in ("0", "1"):
        raise BadRequestError(f"${name}={value!r} is not valid; set it to 1 ({on}) or 0 ({off})")
    return value == "1"


def device() -> str:
    """``$TINKER_COOKBOOK_DEVICE``, ``auto`` when unset (parsed by ``engine.device.resolve_device``)."""
    return _text(DEVICE_ENV) or "auto"


def train_dtype() -> str:
    """``$TINKER_COOKBOOK_TRAIN_DTYPE``; "" when unset: the device's default (``engine.device.base_dtype``)."""
    return _text(TRAIN_DTYPE_ENV)


def sampler_dtype() -> str:
    """``$TINKER_COOKBOOK_SAMPLER_DTYPE``; "" when unset: the device's default (``default_sampling_dtype``)."""
    return _text(SAMPLER_DTYPE_ENV)


def sampler_lora() -> str:
    """``$TINKER_COOKBOOK_SAMPLER_LORA``, ``auto`` when unset (checked by ``sampling.lora.lora_mode``)."""
    return _text(SAMPLER_LORA_ENV) or "auto"


def model_path() -> str:
    """``$TINKER_COOKBOOK_MODEL_PATH``, ``auto`` when unset; another value than auto/general is refused."""
    value = _text(MODEL_PATH_ENV) or "auto"
    if value not in MODEL_PATHS:
        raise BadRequestError(f"${MODEL_PATH_ENV}={value!r} is not valid; set it to auto (the fast paths where they "
                              "exist) or general (the general transformers path for every text model)")
    return value


def compiled() -> bool:
    """Whether compiled paths may run at all (``$TINKER_COOKBOOK_COMPILED``)."""
    return _switch(COMPILED_ENV, "compiled paths where they work", "plain torch kernels")


def decode_kernel() -> bool:
    """Whether the C decode kernel may run: compiled paths on and ``$TINKER_COOKBOOK_DECODE_KERNEL`` not 0."""
    return _switch(DECODE_KERNEL_ENV, "compiled decode", "torch decode") and compiled()


def pack_fp32_base() -> bool:
    """Whether the fp32 base's CPU Linear layers run on packed oneDNN weights (``PACK_FP32_BASE``)."""
    return PACK_FP32_BASE and compiled()


def fused_layers() -> bool:
    """Whether the decoder's layers run as ``fused_layers``' autograd functions on the CPU (``FUSED_LAYERS``)."""
    return FUSED_LAYERS


def c_compiler() -> str | None:
    """``$CC``, or None when unset (the kernel builder then tries cc, gcc, clang)."""
    return os.environ.get(COMPILER_ENV) or None


def store_home() -> Path:
    """The checkpoint store's root: ``$TINKER_COOKBOOK_HOME`` if set, else ``~/.tinker_cookbook``."""
    env = os.environ.get(HOME_ENV)
    return Path(env).expanduser() if env else Path.home() / ".tinker_cookbook"


def torchrun_ranks() -> tuple[int, int, int] | None:
    """``(RANK, WORLD_SIZE, LOCAL_RANK)`` when ``torchrun`` started this process as one of several ranks, else None.
    These are torchrun's variables, read here like the engine's own so that one module reads the environment."""
    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    if world <= 1 or "RANK" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank) or rank)
