"""LoRA snapshots that share one base in the sampler: the adapter kept apart and applied per row.

A merged snapshot (``decoder_model.build_decoder_weights`` with an adapter) holds a full copy of the fused weights,
``W + scale * B @ A``, and decodes in a batch of its own. That is the fastest for a small model on a CPU, but for a
large model every snapshot costs a copy of the model, and requests of different snapshots cannot share a decode
step. In the unmerged mode a snapshot holds only its LoRA factors (``Adapter``) next to one fused base shared by all
snapshots of that base (``shared_base``), and every adapted matmul adds the low-rank update of each row's adapter to
the base output, ``x @ W.T + (x @ (scale * A).T) @ B.T``: requests of the base model and of any number of its
snapshots then decode in one batch, rows grouped by adapter (``for_rows``), as training's mixed-adapter passes do
(``multi_lora.row_segments``). Prefill runs one adapter at a time (the sampler groups a prefill's prompts by
snapshot), so a prompt's K/V are always its own snapshot's.

Which mode a snapshot gets (``use_unmerged``): ``$TINKER_COOKBOOK_SAMPLER_LORA`` or the ``lora_mode`` argument
(``merged`` | ``unmerged`` | ``auto``, the default). ``auto`` keeps the adapter apart when the model's matmul
weights take at least ``UNMERGED_MIN_BYTES`` in the sampling dtype, or when a merged copy would take more than a
quarter of the device's free memory; otherwise it merges. Adapters with full-weight overrides (PEFT's
``modules_to_save``) or a LoRA on the embedding are always merged (they change more than a matmul).

Numerics: the base matmul runs in the weights' dtype as in the merged mode; the LoRA update runs in fp32 (x, A and B
fp32) and is added to the fp32 base output. In fp32 both modes compute the same sums in different orders (they agree
to rounding); in bf16 the unmerged mode is the more precise, as the update is never rounded into bf16 weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import transformers

from tinker_cookbook.engine import base_cache, settings
from tinker_cookbook.engine.sampling import decoder_model
from tinker_cookbook.engine.sampling.adapter import LoraDelta, parse_adapter
from tinker_cookbook.engine.sampling.decoder_model import DecoderWeights, LayerWeights, Linear
from tinker_cookbook.tinker.errors import BadRequestError

LoraMode = Literal["auto", "merged", "unmerged"]
_MODES: tuple[LoraMode, ...] = ("auto", "merged", "unmerged")
UNMERGED_MIN_BYTES = 1 << 30
"""``auto`` keeps adapters apart from this size of matmul weights up (e.g. Qwen3-0.6B in bf16, ~1.2 GB): below it a
merged copy per snapshot is cheap and a merged decode step is faster (no per-row updates)."""

# The sampler's fused matmuls and the HF projections each is made of, in row order.
_FUSED_PARTS: dict[str, tuple[str, ...]] = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}

Rows = slice | torch.Tensor | None
"""The rows of a batch an update applies to: all (None), a contiguous range, or row indices."""


def lora_mode(requested: str | None = None) -> LoraMode:
    """``requested`` (a ``SamplingWeights.build`` argument), else ``$TINKER_COOKBOOK_SAMPLER_LORA``, else auto."""
    source = "lora_mode" if requested is not None else f"${settings.SAMPLER_LORA_ENV}"
    value = (requested.strip().lower() or "auto") if requested is not None else settings.sampler_lora()
    for mode in _MODES:
        if value == mode:
            return mode
    raise BadRequestError(f"{source}={value!r} is not a sampler LoRA mode; use one of {', '.join(_MODES)}")


def _free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` (a GPU's free memory, the host's MemAvailable), or None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def use_unmerged(mode: LoraMode, base_state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> bool:
    """Whether snapshots of this base keep their adapters apart (see the module docstring for ``auto``)."""
    if mode != "auto":
        return mode == "unmerged"
    matrices = [t for t in base_state.values() if t.dim() == 2]
    if not matrices:
        return False
    copy_bytes = sum(t.numel() for t in matrices) * dtype.itemsize
    if copy_bytes >= UNMERGED_MIN_BYTES:
        return True
    free = _free_bytes(matrices[0].device)
    return free is not None and 4 * copy_bytes > free


# --------------------------------------------------------------------------------------------------------------
# One fused base per base model
# --------------------------------------------------------------------------------------------------------------

def shared_base(
    config: transformers.PretrainedConfig, base_state: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> DecoderWeights:
    """The fused weights of ``base_state`` in ``dtype``, built once and shared while any snapshot holds them."""
    return base_cache.shared(
        ("decoder", dtype), base_state,
        lambda: decoder_model.build_decoder_weights(config, base_state, None, None, dtype),
    )


def held_storages(root: object) -> dict[int, int]:
    """``{storage address (or a packed tensor's id): bytes}`` of every tensor reachable from ``root`` (a snapshot's
    weights) through dataclass fields, attributes, lists, tuples and dicts: what it holds, and what it shares with
    another snapshot (the same addresses)."""
    found: dict[int, int] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None or isinstance(item, (str, int, float, bool, torch.dtype, torch.device)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.is_mkldnn:  # a packed weight: opaque, no storage to share; the tensor object is the identity
                found[id(item)] = item.numel() * item.element_size()
            else:
                storage = item.untyped_storage()
                found[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
    return found


# --------------------------------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LowRank:
    """The LoRA update of one fused matmul, ``x @ down.T @ up.T``: fp32, the LoRA scale folded into ``down``.

    A fused matmul (``q|k|v``, ``gate|up``) gets one update: ``down`` stacks the parts' A (they read the same
    input), ``up`` is block-diagonal (each part's B in its own rows and columns), so two matmuls serve all parts.
    Both are ``Linear``s: on the CPU packed for oneDNN like the base weights (the BLAS's fp32 matmuls are several
    times slower there).
    """

    down: Linear
    """[R, in]"""
    up: Linear
    """[out, R]"""
    up_rows: torch.Tensor | None = None
    """``up`` as a plain tensor, for the unembedding only: rows of it are gathered for the exact top logits."""

    def add_to(self, out: torch.Tensor, x: torch.Tensor, rows: Rows) -> None:
        """``out[rows] += x[rows] @ down.T @ up.T`` (``out`` fp32 ``[n, out]``, ``x`` fp32 ``[n, in]``)."""
        if rows is None:
            out += self.up(self.down(x))
        elif isinstance(rows, slice):
            out[rows] += self.up(self.down(x[rows]))
        else:
            out.index_add_(0, rows, self.up(self.down(x.index_select(0, rows))))

    def num_bytes(self) -> int:
        extra = 0 if self.up_rows is None else self.up_rows.numel() * self.up_rows.element_size()
        return self.down.num_bytes() + self.up.num_bytes() + extra


def _low_rank(
    parts: list[tuple[int, LoraDelta | None]], in_features: int, device: torch.device, *, keep_rows: bool = False
) -> LowRank | None:
    """The fused update of parts ``(rows, delta or None)`` stacked in order, or None when no part has a delta;
    ``keep_rows``: with ``up_rows``."""
    present = [delta for _, delta in parts if delta is not None]
    if not present:
        return None
    rank = sum(delta.right.shape[0] for delta in present)
    down = torch.empty(rank, in_features, dtype=torch.float32, device=device)
    up = torch.zeros(sum(rows for rows, _ in parts), rank, dtype=torch.float32, device=device)
    row = column = 0
    for rows, delta in parts:
        if delta is not None:
            r = delta.right.shape[0]
            down[column : column + r] = delta.right.to(device=device, dtype=torch.float32) * delta.scale
            up[row : row + rows, column : column + r] = delta.left.to(device=device, dtype=torch.float32)
            column += r
        row += rows
    return LowRank(down=Linear.of(down, None), up=Linear.of(up, None), up_rows=up if keep_rows else None)


@dataclass(eq=False)
class Adapter:
    """One snapshot's LoRA, kept apart from the base it was trained on (``base``, shared)."""

    base: DecoderWeights
    layers: list[dict[str, LowRank]]
    """Per decoder layer, the update of each adapted fused matmul (``qkv``, ``o_proj``, ``gate_up``, ``down``)."""

    unembed: LowRank | None
    _alone: DecoderWeights | None = None

    def alone(self) -> DecoderWeights:
        """The base with this adapter on every row (prefill, and decode steps of this snapshot only)."""
        if self._alone is None:
            self._alone = _view(self.base, [(self, None)])
        return self._alone

    def num_bytes(self) -> int:
        parts = [u for layer in self.layers for u in layer.values()] + ([self.unembed] if self.unembed else [])
        return sum(u.num_bytes() for u in parts)


def _same(override: torch.Tensor, base: torch.Tensor) -> bool:
    return override.shape == base.shape and torch.equal(override.to(base.device, base.dtype), base)


def build_adapter(
    base: DecoderWeights,
    base_state: Mapping[str, torch.Tensor],
    adapter_state: Mapping[str, torch.Tensor],
    adapter_config: Mapping[str, Any] | None,
) -> Adapter | None:
    """The adapter's factors beside ``base``; None when it must be merged (full-weight overrides, or a LoRA on
    the embedding). Validates as the merged path does (the same errors for the same bad input)."""
    deltas, overrides = parse_adapter(base_state, adapter_state, adapter_config)
    prefix = decoder_model._language_prefix(base_state)
    embed_key = f"{prefix}embed_tokens.weight"
    # PEFT saves the unembedding's base weight beside its LoRA by default: a copy of the base changes nothing.
    changed = [k for k, t in overrides.items() if not _same(t, base_state.get(k, base_state[embed_key]))]
    if changed or embed_key in deltas:
        return None
    used: set[str] = set()

    def update(keys: list[str], unembedding: bool = False) -> LowRank | None:
        """The update of the fused matmul of ``keys`` (parts in row order), checked against the base shapes."""
        parts: list[tuple[int, LoraDelta | None]] = []
        in_features = base.spec.hidden_size
        for key in keys:
            weight = base_state.get(key)  # None: lm_head of a tied model, the embedding's shape
            rows = base.lm_head.shape[0] if weight is None else weight.shape[0]
            in_features = base.spec.hidden_size if weight is None else weight.shape[1]
            delta = deltas.get(key)
            if delta is not None:
                used.add(key)
                if delta.left.shape[0] != rows or delta.right.shape[1] != in_features:
                    raise BadRequestError(
                        f"adapter_state: the LoRA of {key.removesuffix('.weight')!r} is "
                        f"{list(delta.left.shape)} @ {list(delta.right.shape)}, but the base weight is "
                        f"[{rows}, {in_features}]; pass an adapter trained on this base model"
                    )
            parts.append((rows, delta))
        return _low_rank(parts, in_features, base.device, keep_rows=unembedding)

    layers = []
    for index in range(len(base.layers)):
        updates = {}
        for name, modules in _FUSED_PARTS.items():
            low_rank = update([f"{prefix}layers.{index}.{m}.weight" for m in modules])
            if low_rank is not None:
                updates[name] = low_rank
        layers.append(updates)
    unembed = update(["lm_head.weight"], unembedding=True) if "lm_head.weight" in deltas else None
    unused = sorted(set(deltas) - used)
    if unused:
        raise BadRequestError(f"LoRA weights for modules the sampler does not know: {unused[:4]}")
    return Adapter(base=base, layers=layers, unembed=unembed)


# --------------------------------------------------------------------------------------------------------------
# Decoder views: the base with per-row updates
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _UpdatedLinear(Linear):
    """A base matmul plus the LoRA updates of some rows; the output is fp32."""

    updates: tuple[tuple[LowRank, Rows], ...] = ()

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        out = super().raw(x)
        if out.dtype != torch.float32:
            out = out.float()
        if x.dtype != torch.float32:
            x = x.float()
        for low_rank, rows in self.updates:
            low_rank.add_to(out, x, rows)
        return out


def _updated(linear: Linear, updates: list[tuple[LowRank | None, Rows]]) -> Linear:
    present = tuple((u, rows) for u, rows in updates if u is not None)
    if not present:
        return linear
    return _UpdatedLinear(linear.weight, linear.bias, linear.packed, linear.blocked, present)


@dataclass
class _View(DecoderWeights):
    """``base``'s tensors (shared, not copied) with matmuls that add per-row LoRA updates."""

    base: DecoderWeights | None = None
    unembed_updates: tuple[tuple[LowRank, Rows], ...] = ()

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.base is not None
        return self.base.rope_tables(length)  # one cache for all views, grown on the base

    def unembed_update(self, x: torch.Tensor, columns: torch.Tensor) -> torch.Tensor | None:
        if not self.unembed_updates:
            return None
        total = torch.zeros(columns.shape, dtype=torch.float32, device=x.device)
        for low_rank, rows in self.unembed_updates:
            index = slice(None) if rows is None else rows
            assert low_rank.up_rows is not None
            low = low_rank.down(x[index])  # [rows, R]
            part = torch.bmm(low_rank.up_rows[columns[index]], low[:, :, None])[..., 0]  # [rows, k]
            if isinstance(index, torch.Tensor):
                total.index_copy_(0, index, part)
            else:
                total[index] = part
        return total


def _view(base: DecoderWeights, plan: Sequence[tuple[Adapter, Rows]]) -> DecoderWeights:
    layers: list[LayerWeights] = []
    for index, layer in enumerate(base.layers):

        def updated(linear: Linear, name: str) -> Linear:
            return _updated(linear, [(a.layers[index].get(name), rows) for a, rows in plan])  # noqa: B023

        layers.append(dataclasses.replace(
            layer,
            qkv=updated(layer.qkv, "qkv"),
            o_proj=updated(layer.o_proj, "o_proj"),
            gate_up=updated(layer.gate_up, "gate_up"),
            down=updated(layer.down, "down"),
        ))
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(DecoderWeights) if f.init}
    fields.update(
        layers=layers,
        unembed=_updated(base.unembed, [(a.unembed, rows) for a, rows in plan]),
        base=base,
        unembed_updates=tuple((a.unembed, rows) for a, rows in plan if a.unembed is not None),
    )
    return _View(**fields)


def for_rows(base: DecoderWeights, adapters: Sequence[Adapter | None]) -> DecoderWeights:
    """The weights for a batch whose row ``i`` uses ``adapters[i]`` (None: the base alone).

    The base itself when no row has an adapter, the adapter's cached view when all rows have the same one, else a
    view adding each adapter's update to its rows: a slice when they are contiguous, else their indices.
    """
    distinct: dict[int, Adapter | None] = {}
    for adapter in adapters:
        distinct.setdefault(id(adapter), adapter)
    if len(distinct) == 1:
        only = next(iter(distinct.values()))
        return base if only is None else only.alone()
    plan: list[tuple[Adapter, Rows]] = []
    for adapter in distinct.values():
        if adapter is None:
            continue
        if adapter.base is not base:
            raise RuntimeError("an adapter was batched with another base than its own (a sampler bug)")
        rows = [i for i, a in enumerate(adapters) if a is adapter]
        if rows[-1] - rows[0] + 1 == len(rows):
            plan.append((adapter, slice(rows[0], rows[-1] + 1)))
        else:
            plan.append((adapter, torch.tensor(rows, device=base.device)))
    return _view(base, plan)
