"""Several LoRA adapters in one pass through a shared, frozen base: each batch row uses its own adapter.

peft applies its active adapter(s) to every row of a batch, and its per-row ``adapter_names`` refuses training
mode, so a mixed pass works around it: every peft LoRA layer computes the base output only (no active adapter),
and a forward hook adds each adapter's delta ``lora_B(lora_A(x)) * scaling`` to its own contiguous segment of rows
(rows are sorted by adapter) through ``add_fused``, as the single-client path does; the segments are concatenated
with ``torch.cat`` (no in-place writes), so autograd sends each segment's gradient to that adapter's parameters
only. The math per row is peft's ``lora.Linear.forward`` for one vanilla adapter: the same input cast, the same
modules, the same scaling, the same sum (rounded as the single-client path rounds it), under the same autocast.

Adapters of different ranks mix freely (each delta uses its own matrices), and so do different target sets: a layer
an adapter does not target adds nothing to its rows, which is exactly what peft does for that adapter alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch


def lora_layers(peft_model: Any) -> list[Any]:
    """Every peft LoRA layer of ``peft_model`` (Linear or otherwise; ``supports`` says whether we can mix them)."""
    from peft.tuners.lora import LoraLayer

    return [m for m in peft_model.modules() if isinstance(m, LoraLayer)]


def supports(layers: Sequence[Any], names: Sequence[str]) -> bool:
    """Whether a mixed pass reproduces peft for these adapters: plain LoRA on ``nn.Linear`` layers only.

    Variants (DoRA and the like), dropout, LoRA biases, fan-in-fan-out weights or merged layers change peft's
    forward; with any of them the caller runs each request alone instead.
    """
    from peft.tuners.lora import Linear

    for layer in layers:
        if not isinstance(layer, Linear) or layer.merged or layer.disable_adapters or layer.fan_in_fan_out:
            return False
        for name in names:
            if name not in layer.lora_A:
                continue
            if name in layer.lora_variant or not isinstance(layer.lora_dropout[name], torch.nn.Identity):
                return False
            if layer.lora_B[name].bias is not None:
                return False
    return True


def add_fused(layer: Any, name: str, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``output`` plus adapter ``name``'s contribution to ``layer(x)``: peft's ``B(A(x)) * scaling`` (input cast to
    the LoRA weights' dtype), with the scaling applied on the rank-r side and the add fused into the B matmul
    (``addmm``). peft's separate product, scaling and ``+`` make two more passes over the full-width output (and
    one more in the backward) per adapted layer, a large share of a CPU training step. Same sum, rounded
    differently only."""
    lora_a, lora_b = layer.lora_A[name], layer.lora_B[name]
    if x.dtype != lora_a.weight.dtype:
        x = x.to(lora_a.weight.dtype)
    low = lora_a(x) * layer.scaling[name]
    weight_b = lora_b.weight.t()
    if weight_b.dtype != low.dtype:
        # Under autocast (bf16 mode where the CPU cannot pack bf16 weights) A's output is bf16 while B stays fp32;
        # the in-place addmm below is not an autocast op, so it needs the operands in one dtype.
        weight_b = weight_b.to(low.dtype)
    if output.dtype == low.dtype and output.is_contiguous():
        # In place: this runs as the layer's forward hook, so nothing has used the base output yet, and no backward
        # needs it (a Linear's saves its input and weight); an out-of-place addmm would copy the full-width output.
        # Through an alias that autograd does not track as a view (as matmul's own reshapes): an in-place op on a
        # view would make the backward copy the whole gradient (CopySlices).
        flat = torch.ops.aten._unsafe_view(output, (-1, output.shape[-1]))
        flat.addmm_(low.reshape(-1, low.shape[-1]), weight_b)
        return torch.ops.aten._unsafe_view(flat, output.shape)
    flat = torch.addmm(output.reshape(-1, output.shape[-1]).to(low.dtype), low.reshape(-1, low.shape[-1]),
                       weight_b)
    return flat.view(output.shape).to(output.dtype)


def with_adapter(layer: torch.nn.Module, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``layer`` (inside ``no_active_adapter``: its base output) plus adapter ``name``'s delta where it has one."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(layer, LoraLayer) or name not in layer.lora_A:
        return layer

    def apply(x: torch.Tensor) -> torch.Tensor:
        # Fused like the single-client path: on the unembedding each extra [tokens, vocabulary] tensor of
        # ``base + B(A(x)) * scaling`` (two more) would sit on top of the pass's activations.
        return add_fused(layer, name, x, layer(x))

    return apply


@contextlib.contextmanager
def no_active_adapter(layers: Sequence[Any], trainable: dict[str, torch.nn.Parameter]) -> Iterator[None]:
    """Every layer computes its base output only; ``trainable`` (the mixed adapters' parameters) require grad.

    Restores each layer's active adapter afterwards (peft's ``set_adapter`` then resets requires_grad as before).
    """
    previous = [list(layer.active_adapters) for layer in layers]
    try:
        for layer in layers:
            layer.set_adapter([])  # no active adapter: peft's forward is the base layer alone
        for param in trainable.values():
            param.requires_grad_(True)
        yield
    finally:
        for param in trainable.values():
            param.requires_grad_(False)
        for layer, names in zip(layers, previous, strict=True):
            layer.set_adapter(names)


@contextlib.contextmanager
def one_adapter(layers: Sequence[Any], name: str, params: dict[str, torch.nn.Parameter]) -> Iterator[None]:
    """Every layer's output is its base output plus adapter ``name``'s delta on all rows, through ``add_fused``.

    The single-client path: the same adapter as peft's, computed with fewer passes over the outputs. Call only
    where ``supports(layers, [name])``.
    """

    def hook(layer: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        if name not in layer.lora_A:
            return output
        return add_fused(layer, name, args[0], output)

    with no_active_adapter(layers, params), _forward_hooks(layers, hook):
        yield


@contextlib.contextmanager
def row_segments(layers: Sequence[Any], segments: Sequence[tuple[str, int]]) -> Iterator[None]:
    """While active, each layer adds adapter ``name``'s delta to the next ``count`` rows, for each (name, count).

    Needs every adapted layer to see the batch rows on dim 0 (true of dense decoders, whose projections take
    [rows, tokens, features]); a layer that sees another row count is an engine bug and raises.
    """
    counts = [count for _, count in segments]
    rows = sum(counts)

    def hook(layer: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        x = args[0] if args else None
        if x is None or x.shape[0] != rows or output.shape[0] != rows:
            raise RuntimeError(f"a mixed-adapter pass expected {rows} rows at {type(layer).__name__}, got input "
                               f"{None if x is None else list(x.shape)} and output {list(output.shape)}")
        if not any(name in layer.lora_A for name, _ in segments):
            return output
        # split (views; its backward concatenates the pieces' gradients) rather than slicing, whose backward
        # would build a zero-filled gradient of the whole input per segment. Each segment's sum goes through
        # ``add_fused``, as a single client's rows do: one new full-width tensor per segment and one for the
        # concatenation, where a separate delta, its scaled copy and the sum would be three more per layer (they
        # add up on top of the activations, and their varying sizes fragment the heap). Rows of an adapter that
        # does not target this layer keep the base output.
        pieces = [add_fused(layer, name, x_part, out_part) if name in layer.lora_A else out_part
                  for (name, _), x_part, out_part in zip(segments, torch.split(x, counts), torch.split(output, counts),
                                                         strict=True)]
        return torch.cat(pieces)

    with _forward_hooks(layers, hook):
        yield


@contextlib.contextmanager
def _forward_hooks(layers: Sequence[Any], hook: Callable[..., torch.Tensor]) -> Iterator[None]:
    """``hook`` as every layer's forward hook while active (removed however the block ends)."""
    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
