"""The frozen base model's Linear layers on the CPU, through weights pre-packed once for oneDNN.

Training never changes a base weight, and LoRA needs only the gradient of a base Linear's *input*
(``dx = dy @ W``), never of its weight. So each frozen ``nn.Linear`` gets two read-only packed copies, made once:
``W`` for the forward and ``Wᵀ`` for the input gradient, both in oneDNN's blocked layout, in the compute dtype.

- bf16 (``$TINKER_COOKBOOK_TRAIN_DTYPE=bf16`` on a CPU with bf16 matrix instructions): the packed copies are bf16,
  activations are cast to bf16 at the Linear's input and its output returned in fp32 (in bf16 under autocast, as
  autocast's own linear would), so everything around the base matmuls (norms, attention, LoRA, logits, gradients,
  Adam) stays fp32. Compared with ``torch.autocast``, no weight is re-cast per call and the backward runs on the
  packed ``Wᵀ`` too.
- fp32: exact to fp32 rounding (oneDNN's fp32 kernels; only the summation order differs from a BLAS).

Packing is probed once per dtype (``kernels.onednn.can_pack``: a tiny matmul against a float64 reference); where it
does not work (no oneDNN, no bf16 support, a non-CPU tensor, compiled paths off) ``install`` changes nothing and the caller keeps its plain path. The
packed copies cost memory: twice the weights in the compute dtype (SmolLM2-135M: 1.08 GB in fp32; 0.42 GB in bf16,
where the engine leaves the unembedding fp32 and unpacked). A module
whose weight is changed in place after packing is re-packed on its next call (checked through the tensor's
version counter), so a packed copy never serves stale weights.

The probe and the packing are plain functions of a weight (``kernels.onednn``); the sampler's weights
(``sampling.decoder_model.Linear``) use them too.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

from tinker_cookbook.engine.kernels import onednn


class PackedFrozenLinear:
    """The two packed copies of one frozen Linear's weight (``W`` and ``Wᵀ``), re-packed if the weight changes."""

    def __init__(self, module: torch.nn.Linear, dtype: torch.dtype) -> None:
        self.module = module
        self.dtype = dtype
        self._pack()

    def _pack(self) -> None:
        weight = self.module.weight
        self.version = weight._version
        self.forward_weight = onednn.pack(weight, self.dtype)
        self.backward_weight = onednn.pack(weight.T, self.dtype)
        bias = self.module.bias
        self.bias = None if bias is None else bias.detach().to(self.dtype)

    def weights(self) -> PackedFrozenLinear:
        if self.module.weight._version != self.version:
            self._pack()
        return self

    def num_bytes(self) -> int:
        tensors = [self.forward_weight, self.backward_weight] + ([] if self.bias is None else [self.bias])
        return sum(t.numel() * t.element_size() for t in tensors)


class _FrozenLinearFunction(torch.autograd.Function):
    """``y = x Wᵀ + b`` with a frozen ``W``: the backward gives ``dx = dy W`` only (on the packed ``Wᵀ``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: PackedFrozenLinear) -> torch.Tensor:  # type: ignore[override]
        ctx.packed = packed
        ctx.input_dtype = x.dtype
        out = onednn.packed_matmul(x, packed.forward_weight, packed.bias)
        # Under autocast the result stays in the low precision, as autocast's own linear would return it.
        return out if torch.is_autocast_enabled(x.device.type) else out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return onednn.packed_matmul(grad, ctx.packed.backward_weight).to(ctx.input_dtype), None


def frozen_linear(x: torch.Tensor, packed: PackedFrozenLinear) -> torch.Tensor:
    """The frozen Linear of ``packed`` applied to ``x``, in ``x``'s dtype (the matmul in the packed dtype)."""
    return _FrozenLinearFunction.apply(x, packed.weights())


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed: PackedFrozenLinear = self.__dict__["_tinker_packed"]
    if x.device.type != "cpu" or self.weight.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)  # moved off the CPU after packing: the plain path
    return frozen_linear(x, packed)


def install(model: torch.nn.Module, dtype: torch.dtype, skip: tuple[str, ...] = ()) -> int:
    """Route every frozen CPU ``nn.Linear`` of ``model`` through packed ``dtype`` weights; returns the bytes added.

    Nothing changes (and 0 is returned) unless ``onednn.can_pack(dtype)``. Modules whose qualified name ends with one of
    ``skip`` (before or after peft wraps them as ``<name>.base_layer``) keep F.linear. The modules stay what they were (same class, parameters and state dict; peft wraps them
    as usual): only their ``forward`` is replaced, on the instance.
    """
    if not onednn.can_pack(dtype):
        return 0
    added = 0
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear or any(name.removesuffix(".base_layer").endswith(s) for s in skip):
            continue
        weight = module.weight
        if weight.requires_grad or weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        packed = module.__dict__.get("_tinker_packed")
        if packed is None or packed.dtype != dtype:
            packed = PackedFrozenLinear(module, dtype)
            module.__dict__["_tinker_packed"] = packed
            module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
            added += packed.num_bytes()
    return added


def uninstall(model: torch.nn.Module) -> None:
    """Undo ``install``: the modules compute through F.linear again and the packed copies are freed."""
    for module in model.modules():
        if module.__dict__.pop("_tinker_packed", None) is not None:
            del module.forward
