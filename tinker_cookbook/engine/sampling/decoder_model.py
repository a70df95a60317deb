"""A compact decoder for sampling: llama / qwen2 / qwen3 (and the text part of qwen3-vl) without nn.Module overhead.

The sampler advances hundreds of sequences per decode step; HF modules with ``DynamicCache`` spend more time in
Python bookkeeping and small ops than in the matmuls at these sizes. This module keeps only what sampling needs:

- weights fused per layer (``q|k|v`` and ``gate|up`` are one matmul each), LoRA merged once per snapshot
  (``W + scale * B @ A``; or kept apart and added per row, see ``sampling.lora``), bf16 weights pre-packed for
  oneDNN, tied embeddings shared with the unembedding;
- ``prefill``: several prompts packed into one token matrix (no padding) for the linear layers, causal attention per
  prompt, returning each prompt's K/V and final hidden states;
- ``decode`` (``sampling.decode``): one token for each of ``n`` sequences against a slot-major K/V cache;
- ``logits``: the unembedding, with the largest logits of each row recomputed in fp32 when the weights are bf16.

Precision: the residual stream, norms, RoPE, attention (scores, softmax, weighted sum) and the logits run in fp32;
only the matmul weights take the snapshot's dtype (and the K/V cache on a GPU, see ``kv_cache_dtype``; prefill then
attends to the K/V rounded as decode reads them). In fp32 this reproduces the HF forward to ~1e-5.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import transformers

from tinker_cookbook.engine.kernels import decode_kernel, onednn
from tinker_cookbook.engine.sampling.adapter import LoraDelta, parse_adapter
from tinker_cookbook.engine.training.passes import shared_prefix_length
from tinker_cookbook.tinker.errors import BadRequestError

if TYPE_CHECKING:
    from tinker_cookbook.engine.vision import PackedVision

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_vl", "qwen3_vl_text")
# RoPE variants whose frequencies do not depend on the sequence length seen so far.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
EXACT_TOP_LOGITS = 32
"""How many of each row's largest logits are recomputed in fp32 when the unembedding is low precision."""


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a decoder, read from its HF config."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_eps: float
    qk_norm: bool
    max_positions: int
    """The context window: prompt plus generated tokens may not exceed it."""


@dataclass
class Linear:
    """A matmul weight ``[out, in]`` (+ bias); on CPU pre-packed into oneDNN's blocked layout (bf16 and fp32).

    F.linear re-lays out a bf16 weight for the AMX/AVX-512 kernels on every call; packing it once per snapshot
    makes decode-sized matmuls 25-50% faster with bit-identical results. In fp32, oneDNN's packed kernels are
    2-5x faster than F.linear where the BLAS behind it does not use AVX-512 (the probe and the packing are
    ``kernels.onednn``'s, shared with training). Matmuls of up to ``decode_kernel.MATMUL_MAX_ROWS`` rows of a
    packed fp32 weight read it in ``decode_kernel.matmul`` (``blocked``), faster than oneDNN at those sizes and on
    every thread the caller may use.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: bool = False
    blocked: decode_kernel.Blocked | None = None

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        weight = weight.contiguous()
        cpu = weight.device.type == "cpu"
        if bias is not None:
            bias = bias.to(weight.dtype).contiguous()
        if weight.dtype in (torch.bfloat16, torch.float32) and cpu and onednn.can_pack(weight.dtype):
            packed = onednn.pack(weight, weight.dtype)
            return cls(packed, bias, packed=True, blocked=decode_kernel.blocked(packed, weight))
        return cls(weight, bias)

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """``x [rows, in]`` -> ``[rows, out]`` in the weight's dtype."""
        # Conversions only when needed: a decode step makes ~4 calls per layer, each torch call costs microseconds.
        if x.dtype != self.weight.dtype:
            x = x.to(self.weight.dtype)
        few_rows = x.dim() == 2 and x.shape[0] <= decode_kernel.MATMUL_MAX_ROWS
        if self.blocked is not None and few_rows and decode_kernel.enabled():
            return decode_kernel.matmul(self.blocked, self.bias, x)
        if self.packed:
            if not x.is_contiguous():
                x = x.contiguous()
            return onednn.packed_rows(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 ``x [rows, in]`` -> fp32 ``[rows, out]``; the matmul runs in the weight's dtype."""
        out = self.raw(x)
        return out if out.dtype == torch.float32 else out.float()

    def num_bytes(self) -> int:
        tensors = [self.weight] + ([] if self.bias is None else [self.bias])
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class LayerWeights:
    """One decoder layer; ``qkv``/``gate_up`` are row-concatenations of the HF projections."""

    input_norm: torch.Tensor
    qkv: Linear
    o_proj: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    qk_norm: torch.Tensor | None
    """[num_heads + num_kv_heads, head_dim]: the q_norm weight repeated per query head, then k_norm per kv head."""


@dataclass
class DecoderWeights:
    """All tensors of one model snapshot, ready for ``prefill`` and ``decode``."""

    spec: DecoderSpec
    dtype: torch.dtype
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    """The unembedding ``[vocab, H]`` as a plain tensor (rows are gathered from it); the embedding when tied."""

    unembed: Linear
    inv_freq: torch.Tensor
    rope_scaling: float
    _rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed-sin tables ``[>= length, head_dim]``, built lazily and grown by doubling."""
        tables = self._rope_cache
        if tables is None or tables[0].shape[0] < length:
            have = 0 if tables is None else tables[0].shape[0]
            size = max(length, min(max(2 * have, 256), self.spec.max_positions))
            # Same arithmetic as the HF rotary embedding (fp32 position * fp32 inv_freq) so fp32 matches bit for bit.
            positions = torch.arange(size, device=self.device, dtype=torch.float32)
            freqs = positions[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            sin = emb.sin() * self.rope_scaling
            # rotate_half(x) = cat(-x2, x1) = roll(x, half) with its first half negated: fold that sign into sin.
            sin[:, : freqs.shape[1]] *= -1
            # One attribute holds both tables so that a concurrent reader never pairs tables of different sizes.
            tables = (emb.cos() * self.rope_scaling, sin)
            self._rope_cache = tables
        return tables

    def unembed_update(self, x: torch.Tensor, columns: torch.Tensor) -> torch.Tensor | None:
        """What an unmerged LoRA adds to the logits at ``columns [rows, k]`` of normed hidden states ``x [rows, H]``
        (``[rows, k]`` fp32), or None: merged weights have none (``sampling.lora``'s views override this)."""
        return None

    def num_bytes(self) -> int:
        """Bytes of the tensors read for every decoded token (all matmul weights, norms, the unembedding)."""
        total = self.unembed.num_bytes() + self.final_norm.numel() * self.final_norm.element_size()
        for layer in self.layers:
            for part in vars(layer).values():
                if isinstance(part, Linear):
                    total += part.num_bytes()
                elif isinstance(part, torch.Tensor):
                    total += part.numel() * part.element_size()
        return total


# --------------------------------------------------------------------------------------------------------------
# Building from an HF state dict (+ PEFT LoRA)
# --------------------------------------------------------------------------------------------------------------


def text_config(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    """The language-model part of ``config`` (the config itself for text-only models)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def spec_from_config(config: transformers.PretrainedConfig) -> DecoderSpec:
    """Read the decoder shape; raise BadRequestError for architectures this sampler does not implement."""
    model_type = getattr(config, "model_type", "")
    text = text_config(config)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise BadRequestError(
            f"the sampler supports model types {SUPPORTED_MODEL_TYPES}, got config.model_type={model_type!r}; "
            "use a Llama-3, Qwen2/Qwen3 or Qwen3-VL model"
        )
    if getattr(text, "use_sliding_window", False):
        raise BadRequestError(
            "config.use_sliding_window=True is not supported by the sampler; set it to False"
        )
    num_heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
    return DecoderSpec(
        model_type=model_type,
        num_layers=text.num_hidden_layers,
        hidden_size=text.hidden_size,
        num_heads=num_heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        intermediate_size=text.intermediate_size,
        vocab_size=text.vocab_size,
        rms_eps=float(text.rms_norm_eps),
        qk_norm=model_type.startswith("qwen3"),
        max_positions=int(text.max_position_embeddings),
    )


def rope_frequencies(config: transformers.PretrainedConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scaling factor, through transformers' own RoPE initialisers."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = text_config(config)
    params = getattr(text, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in _STATIC_ROPE_TYPES:
        raise BadRequestError(
            f"rope_type={rope_type!r} is not supported by the sampler; supported: {_STATIC_ROPE_TYPES}"
        )
    if rope_type == "default":
        theta = float(params.get("rope_theta", getattr(text, "rope_theta", 10000.0)))
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return inv_freq, 1.0
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](text, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


def _language_prefix(base_state: Mapping[str, torch.Tensor]) -> str:
    """``model.`` for causal LMs, ``model.language_model.`` for Qwen3-VL."""
    for prefix in ("model.language_model.", "model."):
        if f"{prefix}embed_tokens.weight" in base_state:
            return prefix
    raise BadRequestError(
        "base_state has no 'model.embed_tokens.weight' (nor 'model.language_model.embed_tokens.weight'); "
        "pass the plain HF state dict of the base causal LM"
    )


class _StateReader:
    """Reads base tensors with their LoRA delta merged, tracking which deltas were used."""

    def __init__(self, base: Mapping[str, torch.Tensor], deltas: dict[str, LoraDelta], dtype: torch.dtype):
        self.base = base
        self.deltas = deltas
        self.dtype = dtype
        self.used: set[str] = set()

    def _base(self, key: str, fallback: str | None) -> torch.Tensor:
        source = key if key in self.base else fallback
        if source is None or source not in self.base:
            raise BadRequestError(
                f"base_state has no tensor {key!r}; pass the full HF state dict of the base model"
            )
        return self.base[source].detach()

    def get(self, key: str, *, fallback: str | None = None) -> torch.Tensor:
        return self.fused([key], fallback=fallback)

    def fused(self, keys: list[str], *, fallback: str | None = None) -> torch.Tensor:
        """The row-concatenation of the tensors at ``keys`` with their LoRA deltas merged, in the reader's dtype.

        Merged and fused weights are new tensors (the base state is shared with the trainer and must not change),
        each block written once: ``addmm`` of the base and the LoRA factors straight into it.
        """
        tensors = [self._base(key, fallback) for key in keys]
        deltas = [self.deltas.get(key) for key in keys]
        if len(keys) == 1 and deltas[0] is None:
            return tensors[0].to(self.dtype)
        merging = any(d is not None for d in deltas)
        shape = (sum(t.shape[0] for t in tensors), *tensors[0].shape[1:])
        out = torch.empty(shape, dtype=torch.float32 if merging else self.dtype, device=tensors[0].device)
        row = 0
        for key, tensor, delta in zip(keys, tensors, deltas, strict=True):
            block = out[row : row + tensor.shape[0]]
            row += tensor.shape[0]
            if delta is None:
                block.copy_(tensor)
            else:
                self.used.add(key)
                delta.merge_into(block, tensor)
        return out.to(self.dtype)

    def maybe(self, key: str) -> torch.Tensor | None:
        return self.get(key) if key in self.base else None

    def norm(self, key: str) -> torch.Tensor:
        return self.base[key].detach().float() if key in self.base else self.get(key)


def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if len(present) != len(parts):
        raise BadRequestError("base_state has biases for some but not all of q/k/v (or gate/up) projections")
    return torch.cat(present, dim=0).contiguous()


def _layer(reader: _StateReader, prefix: str, spec: DecoderSpec) -> LayerWeights:
    attn, mlp = f"{prefix}self_attn.", f"{prefix}mlp."
    qk_norm = None
    if spec.qk_norm:
        q_norm = reader.norm(f"{attn}q_norm.weight")
        k_norm = reader.norm(f"{attn}k_norm.weight")
        qk_norm = torch.cat(
            [q_norm.expand(spec.num_heads, -1), k_norm.expand(spec.num_kv_heads, -1)]
        ).contiguous()
    return LayerWeights(
        input_norm=reader.norm(f"{prefix}input_layernorm.weight").float(),
        qkv=Linear.of(
            reader.fused([f"{attn}{p}_proj.weight" for p in "qkv"]),
            _cat([reader.maybe(f"{attn}{p}_proj.bias") for p in "qkv"]),
        ),
        o_proj=Linear.of(reader.get(f"{attn}o_proj.weight"), reader.maybe(f"{attn}o_proj.bias")),
        post_norm=reader.norm(f"{prefix}post_attention_layernorm.weight").float(),
        gate_up=Linear.of(
            reader.fused([f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"]),
            _cat([reader.maybe(f"{mlp}gate_proj.bias"), reader.maybe(f"{mlp}up_proj.bias")]),
        ),
        down=Linear.of(reader.get(f"{mlp}down_proj.weight"), reader.maybe(f"{mlp}down_proj.bias")),
        qk_norm=qk_norm,
    )


def build_decoder_weights(
    config: transformers.PretrainedConfig,
    base_state: Mapping[str, torch.Tensor],
    adapter_state: Mapping[str, torch.Tensor] | None,
    adapter_config: Mapping[str, Any] | None,
    dtype: torch.dtype,
) -> DecoderWeights:
    """Fuse and (optionally) LoRA-merge an HF state dict into sampler weights of ``dtype``."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise BadRequestError(f"sampling dtype must be float32, bfloat16 or float16, got {dtype}")
    spec = spec_from_config(config)
    deltas: dict[str, LoraDelta] = {}
    state: Mapping[str, torch.Tensor] = base_state
    if adapter_state:
        deltas, overrides = parse_adapter(base_state, adapter_state, adapter_config)
        state = collections.ChainMap(overrides, dict(base_state))
    prefix = _language_prefix(state)
    reader = _StateReader(state, deltas, dtype)
    embed_key = f"{prefix}embed_tokens.weight"
    embed = reader.get(embed_key).contiguous()
    if "lm_head.weight" in state or "lm_head.weight" in deltas:
        # A trained unembedding of a tied model gets its own (untied) merged copy of the embedding.
        lm_head = reader.get("lm_head.weight", fallback=embed_key).contiguous()
    else:
        lm_head = embed
    layers = [_layer(reader, f"{prefix}layers.{i}.", spec) for i in range(spec.num_layers)]
    unused = sorted(set(deltas) - reader.used)
    if unused:
        raise BadRequestError(f"LoRA weights for modules the sampler does not know: {unused[:4]}")
    inv_freq, rope_scaling = rope_frequencies(config)
    return DecoderWeights(
        spec=spec,
        dtype=dtype,
        embed=embed,
        layers=layers,
        final_norm=reader.norm(f"{prefix}norm.weight").float(),
        lm_head=lm_head,
        unembed=Linear.of(lm_head, None),
        inv_freq=inv_freq.to(embed.device),
        rope_scaling=rope_scaling,
    )


# --------------------------------------------------------------------------------------------------------------
# Forward pieces
# --------------------------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32 (x is fp32) over the last dim: ``weight * (x * rsqrt(mean(x^2) + eps))``, the HF module's
    arithmetic, in one torch call. ``weight [d]``, or ``[heads, d]`` for a per-head weight (q/k norms)."""
    if weight.dim() == 1:
        return F.rms_norm(x, weight.shape, weight, eps)
    return F.rms_norm(x, x.shape[-1:], None, eps) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [tokens, heads, head_dim]`` by per-token ``cos``/``sin`` ``[tokens, 1, head_dim]``."""
    half = x.shape[-1] // 2
    return x * cos + torch.roll(x, half, dims=-1) * sin_signed


def attention_inputs(
    weights: DecoderWeights, layer: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``[T, nh, hd]``, k and v ``[T, nkv, hd]`` (fp32) for hidden states ``h [T, H]``; ``cos``/``sin``
    ``[T, 1, hd]``."""
    spec = weights.spec
    x = rms_norm(h, layer.input_norm, spec.rms_eps)
    n_qk = spec.num_heads + spec.num_kv_heads
    qkv = layer.qkv(x).view(-1, n_qk + spec.num_kv_heads, spec.head_dim)
    qk, v = qkv[:, :n_qk], qkv[:, n_qk:]
    if layer.qk_norm is not None:
        qk = rms_norm(qk, layer.qk_norm, spec.rms_eps)
    qk = _rope(qk, cos, sin)
    return qk[:, : spec.num_heads], qk[:, spec.num_heads :], v


def finish_layer(layer: LayerWeights, h: torch.Tensor, attn: torch.Tensor, eps: float) -> torch.Tensor:
    """Output projection, residual, MLP, residual."""
    h = h + layer.o_proj(attn)
    # gate|up stays in the weight dtype: the SiLU product goes straight into the down projection.
    gate, up = layer.gate_up.raw(rms_norm(h, layer.post_norm, eps)).chunk(2, dim=-1)
    return h + layer.down(F.silu(gate).mul_(up))


def logits(weights: DecoderWeights, h: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits ``[rows, vocab]`` for final-layer hidden states ``h [rows, H]`` (final norm applied here).

    With a low-precision unembedding the product is rounded to that precision (bf16 keeps 8 bits: a logit of 20 is
    off by up to 0.06). The ``EXACT_TOP_LOGITS`` largest logits of each row, and the columns ``also [rows, m]``,
    are recomputed in fp32 from the same weights; they carry nearly all of the probability mass, so sampling and
    the reported logprobs follow the fp32 unembedding closely at a small fraction of its cost.
    """
    x = rms_norm(h, weights.final_norm, weights.spec.rms_eps)
    out = weights.unembed(x)
    if weights.lm_head.dtype == torch.float32:
        return out
    columns = top_columns(out, EXACT_TOP_LOGITS)
    if also is not None:
        columns = torch.cat([columns, also], dim=-1)
    rows = weights.lm_head[columns].float()  # [rows, k, H]
    exact = torch.bmm(rows, x[:, :, None])[..., 0]
    update = weights.unembed_update(x, columns)  # an unmerged LoRA on the unembedding (sampling.lora)
    if update is not None:
        exact += update
    return out.scatter_(1, columns, exact)


def token_logits(weights: DecoderWeights, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
    """The fp32 logit of ``tokens[i]`` for each row of final-layer hidden states ``h [rows, H]``; None when the
    unembedding is fp32 already (``logits`` is exact then).

    ``logits`` recomputes only the largest logits exactly; a sampled token outside them would report a logprob
    off by the unembedding's rounding, and differ from the same token's prompt logprob (which is exact).
    """
    if weights.lm_head.dtype == torch.float32:
        return None
    x = rms_norm(h, weights.final_norm, weights.spec.rms_eps)
    exact = (weights.lm_head[tokens].float() * x).sum(-1)
    update = weights.unembed_update(x, tokens[:, None])
    return exact if update is None else exact + update[:, 0]


def top_columns(values: torch.Tensor, k: int, block: int = 64) -> torch.Tensor:
    """Column indices of the ``k`` largest values of each row, largest first: ``topk(k).indices``, but faster.

    A full-width ``topk`` over a vocabulary-sized row is slow on CPU. The ``k`` largest values lie in at most ``k``
    blocks, and those blocks have the ``k`` largest block maxima; so take the block maxima (one fast reduction),
    the best ``k`` blocks, and ``topk`` over only their columns.
    """
    rows, width = values.shape
    k = min(k, width)
    if width % block or k * block * 4 > width:
        return values.topk(k, dim=-1).indices
    maxima = values.view(rows, width // block, block).amax(dim=-1)
    blocks = maxima.topk(k, dim=-1).indices
    columns = (blocks[:, :, None] * block + torch.arange(block, device=values.device)).view(rows, -1)
    best = values.gather(1, columns).topk(k, dim=-1).indices
    return columns.gather(1, best)


def kv_cache_dtype(weights: DecoderWeights) -> torch.dtype:
    """The K/V cache precision: fp32 on CPU, the weights' dtype on an accelerator.

    Attention always computes in fp32 on the K/V as stored, in prefill and decode alike. On CPU an fp32 cache is
    read directly (no per-step conversion) and keeps sampler logprobs closest to the fp32 learner; on a GPU a bf16
    cache halves the memory that bounds the batch.
    """
    return torch.float32 if weights.device.type == "cpu" else weights.dtype


@dataclass
class PrefillResult:
    """Per prompt: its K/V ``[layers, 2, nkv, len, hd]`` and the final hidden states of all its positions."""

    kv: list[torch.Tensor]
    hidden: list[torch.Tensor]


@torch.inference_mode()
def prefill(
    weights: DecoderWeights, prompts: list[list[int]], cache_dtype: torch.dtype, images: PackedVision | None = None
) -> PrefillResult:
    """Run several prompts packed into one token matrix; attention is causal within each prompt.

    Text prompts that all start with the same tokens (``shared_prefix_length``: an RL batch's system prompt and
    few-shot examples) compute that prefix once: it is the first segment of the packed matrix, and each prompt's
    own tokens attend to its K/V, then to their own, causally. The arithmetic per position is the same; only the
    attention kernel differs (an explicit mask instead of ``is_causal``), a few ulp.
    ``images`` (Qwen3-VL) puts image features and multimodal rotary positions into the packed prompts.
    """
    spec = weights.spec
    lengths = [len(p) for p in prompts]
    shared = shared_prefix_length(prompts) if images is None else 0
    segments = ([prompts[0][:shared]] if shared else []) + [p[shared:] for p in prompts]
    total = sum(len(segment) for segment in segments)
    device = weights.device
    tokens = torch.tensor([t for segment in segments for t in segment], dtype=torch.long, device=device)
    positions = torch.cat(
        ([torch.arange(shared, device=device)] if shared else [])
        + [torch.arange(shared, n, device=device) for n in lengths]
    )
    cos_table, sin_table = weights.rope_tables(max(lengths))
    cos, sin = cos_table[positions], sin_table[positions]
    kv = [
        torch.empty(spec.num_layers, 2, spec.num_kv_heads, n, spec.head_dim, dtype=cache_dtype, device=device)
        for n in lengths
    ]
    starts = [shared]  # each prompt's own tokens, after the shared prefix (if any) at rows 0..shared-1
    for n in lengths:
        starts.append(starts[-1] + n - shared)
    # Prompt i's own row r (position shared + r) attends to positions 0..shared + r.
    masks = {
        n: torch.arange(n, device=device)[None, :] <= torch.arange(shared, n, device=device)[:, None]
        for n in set(lengths)
    } if shared else {}
    h = weights.embed[tokens].float()
    if images is not None:
        h, cos, sin = images.inputs(h, cos, sin)
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    attn = torch.empty(total, spec.num_heads * spec.head_dim, dtype=torch.float32, device=device)
    for index, layer in enumerate(weights.layers):
        q, k, v = attention_inputs(weights, layer, h, cos, sin)
        if cache_dtype != torch.float32:
            # Attend to the K/V as decode will read them back from the cache: both paths see the same values.
            k, v = k.to(cache_dtype).float(), v.to(cache_dtype).float()
        if shared:
            k_p, v_p = k[:shared].transpose(0, 1), v[:shared].transpose(0, 1)  # [nkv, shared, hd]
            out = F.scaled_dot_product_attention(
                q[:shared].transpose(0, 1)[None], k_p[None], v_p[None], is_causal=True, enable_gqa=True
            )
            attn[:shared] = out[0].transpose(0, 1).reshape(shared, -1)
        for i, (start, end) in enumerate(itertools.pairwise(starts)):
            k_i, v_i = k[start:end].transpose(0, 1), v[start:end].transpose(0, 1)  # [nkv, own, hd]
            if shared:
                kv[i][index, 0, :, :shared].copy_(k_p)
                kv[i][index, 1, :, :shared].copy_(v_p)
            kv[i][index, 0, :, shared:].copy_(k_i)
            kv[i][index, 1, :, shared:].copy_(v_i)
            q_i = q[start:end].transpose(0, 1)[None]
            if shared:
                keys, values = as_fp32(kv[i][index, 0])[None], as_fp32(kv[i][index, 1])[None]
                out = F.scaled_dot_product_attention(
                    q_i, keys, values, attn_mask=masks[lengths[i]], enable_gqa=True
                )
            else:
                out = F.scaled_dot_product_attention(q_i, k_i[None], v_i[None], is_causal=True, enable_gqa=True)
            attn[start:end] = out[0].transpose(0, 1).reshape(end - start, -1)
        h = finish_layer(layer, h, attn, spec.rms_eps)
        if images is not None:
            h = images.after_layer(index, h)
    own = [h[s:e] for s, e in itertools.pairwise(starts)]
    hidden = [torch.cat([h[:shared], mine]) for mine in own] if shared else own
    return PrefillResult(kv=kv, hidden=hidden)


def as_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32 (no torch call when it is already: the CPU cache is fp32)."""
    return x if x.dtype == torch.float32 else x.float()
