"""Faster CPU versions of a decoder's element-wise layers, rotary embedding and attention, for training.

The Hugging Face modules compute RMSNorm, the MLP's ``silu(gate) * up`` and attention from many small ops that
autograd records one by one: each op sweeps a full activation tensor and saves what its backward needs. On a CPU
those sweeps are a large share of a LoRA training step (the frozen base's matmuls are packed, ``frozen_linear``).
Here each is one ``torch.autograd.Function`` whose forward saves only its inputs and whose backward is written by
hand in a few fused ops:

- ``RMSNorm``: ``w * x * rsqrt(mean(x²) + eps)``; saves ``x`` and the per-row ``rsqrt`` (HF's autograd keeps the
  fp32 upcast, the squared input and the normalised product as well). The norm's weight is frozen: no gradient.
- ``silu(gate) * up``: saves ``gate`` and ``up`` (autograd also keeps ``silu(gate)``); the backward recomputes the
  sigmoid.
- the rotary embedding: q and k rotated in one node that saves only ``cos`` and ``sin`` (HF's ``rotate_half``
  concatenates a negated half, and autograd keeps the products and zero-fills full-size slices in the backward);
  the backward is the rotation by the opposite angle. It runs in the attention module's forward (``ATTENTION_CLASSES``:
  projections, rotation, cache, attention implementation, output projection, as HF's).
- attention: causal attention computed per chunk of batch rows (one row from ~256 tokens, several shorter ones
  together) and per block of queries with batched matmuls whose temporaries (one block's scores, all heads) stay
  in the CPU's caches; the keys a causal block cannot see are skipped, the query heads of one key/value head are
  stacked along the queries (keys and values are not repeated), and the backward recomputes the probabilities
  (nothing of size queries x keys is saved, as with torch's flash kernel). It replaces torch's CPU flash-attention kernel, which at
  these head sizes (64) runs several times below the matmul peak. Rows packed into one sequence (``packed_rows``)
  get each row's causal attention on its own.

Every replacement computes the same function as the module it replaces, to fp32 rounding (only the order of sums
differs). ``install`` applies them to a model's modules in place (per-instance ``forward`` methods and the attention
implementation registered with transformers under ``ATTENTION_NAME``); ``uninstall`` restores the HF path. Where a
module does not match what these functions compute (a norm or MLP class not listed here, another activation, a
non-fp32 tensor, an attention mask that is not causal or boolean, a sliding window, dropout, a vision-language
model) it keeps its own forward or SDPA, so any architecture runs, at worst at the HF speed. Qwen3's q/k norms are
RMSNorms over the head dimension and take the fused one like the others.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION_NAME = "tinker_cookbook_fused"
"""The name under which ``attention`` is registered with transformers' attention and mask interfaces."""
QUERY_BLOCK = 128
"""Queries per attention block: one block's scores (``heads x QUERY_BLOCK x keys`` fp32) stay in the L2/L3 cache at
the sequence lengths training sees, and causal blocks skip the keys after their last query."""
MIN_QUERIES = 256
"""Outside ``device.fast_fp32_matmuls`` (torch's BLAS for fp32), shorter passes keep SDPA: there the fused loop
beat torch's CPU kernel (forward + backward, head size 64) from about 256 queries per row (0.76-0.79x its time at
512, 0.91-1.0x at 256) and lost below (1.05-1.5x at 64-128, and at RL's shared-prefix shapes). Inside it (every
training pass where oneDNN's fp32 kernels are exact) SDPA's kernel runs 2-8x slower than there, and the fused
loop, which batches short rows together, took 0.13-0.65x SDPA's time at every shape measured (8 rows of 40
tokens to 512 tokens; 8-16 rows of 30-60 tokens after a 100-200 token shared prefix): fused at any length."""
NORM_CLASSES = ("LlamaRMSNorm", "Qwen3RMSNorm")
MLP_CLASSES = ("LlamaMLP", "Qwen3MLP")
ATTENTION_CLASSES = ("LlamaAttention", "Qwen3Attention")
"""The HF classes whose forward these functions reproduce (checked by tests/engine/test_fused_layers.py)."""

_saved_forward = "_tinker_fused_forward"


# -- RMSNorm -----------------------------------------------------------------------------------------------


class _RMSNormFunction(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x², -1) + eps))`` for fp32 ``x`` and a frozen ``weight``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd).mul_(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        # y = w·x·r with r = (mean(x²) + eps)^(-1/2): dx = r·(w·dy) - x·r³·<w·dy, x>/n.
        scaled = grad * weight
        dot = torch.linalg.vecdot(scaled, x).unsqueeze(-1)
        coeff = dot.mul_(rstd.pow(3)).div_(-x.shape[-1])
        return scaled.mul_(rstd).addcmul_(x, coeff), None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Llama/Qwen RMSNorm of fp32 ``x`` (frozen ``weight``), in one autograd node."""
    return _RMSNormFunction.apply(x, weight, eps)


def _norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    if hidden_states.dtype != torch.float32 or self.weight.dtype != torch.float32 or self.weight.requires_grad:
        return getattr(self, _saved_forward)(hidden_states)
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


# -- the MLP's silu(gate) * up -----------------------------------------------------------------------------


class _SiluMulFunction(torch.autograd.Function):
    """``silu(gate) * up``, saving only ``gate`` and ``up``."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        return F.silu(gate).mul_(up)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        gate, up = ctx.saved_tensors
        d_up = F.silu(gate).mul_(grad)
        # silu'(g) = s·(1 + g·(1 - s)), s = sigmoid(g): aten's silu_backward computes grad·silu'(g) in one sweep.
        d_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return d_gate, d_up


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one autograd node."""
    return _SiluMulFunction.apply(gate, up)


def _mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if gate.dtype != torch.float32 or up.dtype != torch.float32:
        return self.down_proj(self.act_fn(gate) * up)
    return self.down_proj(silu_mul(gate, up))


def _is_silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


# -- attention ---------------------------------------------------------------------------------------------


ROWS_SCORES = 2 * QUERY_BLOCK * QUERY_BLOCK
"""Query x key entries per head that one block of several short batch rows may hold: rows are batched together
until their block's scores reach this size (one row at a time from ~256 tokens), so that short rows still make
matmuls large enough to run near the peak rather than one small product per row."""


def _blocks(q_len: int) -> list[tuple[int, int]]:
    """Query blocks of at most ``QUERY_BLOCK`` and of equal size (to one query): no small tail block."""
    count = -(-q_len // QUERY_BLOCK)
    size = -(-q_len // count)
    return [(start, min(start + size, q_len)) for start in range(0, q_len, size)]


def _row_chunks(batch: int, q_len: int, k_len: int) -> list[tuple[int, int]]:
    rows = max(1, ROWS_SCORES // (min(q_len, QUERY_BLOCK) * k_len))
    return [(start, min(start + rows, batch)) for start in range(0, batch, rows)]


def _probabilities(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, rows: int, start: int, size: int,
                   causal: torch.Tensor) -> torch.Tensor:
    """One block's softmax(q kᵀ), ``[r·kv_h, group·size, keys]``, over the keys each query sees: ``q [r·kv_h,
    group·size, d]`` the pre-scaled queries ``[start, start + size)`` of each key/value head's query heads, one head
    after the other; ``k [r·kv_h, m, d]``.

    ``mask`` None: causal, the block of equally many queries and keys sees keys ``< start + size``, and only its
    diagonal square needs masking (``causal``: -inf above the diagonal, added there); else the boolean mask's
    ``[r or 1, 1, n, m]`` rows (True: masked out), the same for every head of a row.
    """
    end = start + size
    if mask is None:
        scores = torch.bmm(q, k[:, :end].transpose(1, 2))
        scores.view(-1, size, end)[:, :, start:].add_(causal[:size, :size])
    else:
        scores = torch.bmm(q, k.transpose(1, 2))
        scores.view(rows, -1, size, k.shape[1]).masked_fill_(mask[:, :, start:end], -math.inf)
    return torch.softmax(scores, dim=-1)


class _AttentionFunction(torch.autograd.Function):
    """Softmax attention of ``q [b, h, n, d]`` on ``k, v [b, kv_h, m, d]``, causal (``mask`` None, n = m) or under
    a boolean mask ``[b or 1, 1, n, m]`` (True: attend), scaled by ``scale``.

    Returns ``[b, n, h, d]`` (the layout the output projection reads). Saves q, k, v and the output; the backward
    recomputes each block's probabilities. Per chunk of batch rows (``_row_chunks``) and block of queries, the
    query heads that share a key/value head are stacked along the queries (``[r·kv_h, group·size, d]``, made
    contiguous once: oneDNN's batched matmul copies any other layout at every use), so that every product is one
    batched matmul over rows and key/value heads, the keys and values are used as they are (not repeated per query
    head), and the key/value gradients come out summed over each group.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
                mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        batch, heads, q_len, _ = q.shape
        kv_heads, k_len = k.shape[1], k.shape[2]
        scaled = torch.empty(q.shape, dtype=q.dtype, device=q.device).copy_(q).mul_(scale)
        causal = _upper_triangle(q.device)
        out = q.new_empty(batch, q_len, heads, v.shape[-1])
        for first, last in _row_chunks(batch, q_len, k_len):
            rows = last - first
            k_rows = k[first:last].reshape(rows * kv_heads, k_len, -1)
            v_rows = v[first:last].reshape(rows * kv_heads, k_len, -1)
            row_mask = None if mask is None else mask[first:last] if mask.shape[0] > 1 else mask
            for start, end in _blocks(q_len):
                size = end - start
                q_block = scaled[first:last, :, start:end].reshape(rows * kv_heads, -1, q.shape[-1])
                probs = _probabilities(q_block, k_rows, row_mask, rows, start, size, causal)
                block = torch.bmm(probs, v_rows[:, : probs.shape[-1]])
                out[first:last, start:end] = block.view(rows, heads, size, -1).transpose(1, 2)
        ctx.save_for_backward(scaled, k, v, out, mask)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:  # type: ignore[override]
        scaled, k, v, out, mask = ctx.saved_tensors
        batch, heads, q_len, d = scaled.shape
        kv_heads, k_len = k.shape[1], k.shape[2]
        causal = _upper_triangle(scaled.device)
        dq = torch.empty_like(scaled)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        for first, last in _row_chunks(batch, q_len, k_len):
            rows = last - first
            k_rows = k[first:last].reshape(rows * kv_heads, k_len, -1)
            v_rows = v[first:last].reshape(rows * kv_heads, k_len, -1)
            row_mask = None if mask is None else mask[first:last] if mask.shape[0] > 1 else mask
            dk_rows, dv_rows = torch.zeros_like(k_rows), torch.zeros_like(v_rows)
            for start, end in _blocks(q_len):
                size = end - start
                q_block = scaled[first:last, :, start:end].reshape(rows * kv_heads, -1, d)
                d_out = grad[first:last, start:end].transpose(1, 2).reshape(rows * kv_heads, -1, grad.shape[-1])
                # Σ_j P_ij dP_ij = <dO_i, O_i>: the softmax backward's row term, per head and query.
                row_terms = torch.linalg.vecdot(d_out.view(rows, heads, size, -1),
                                                out[first:last, start:end].transpose(1, 2))
                probs = _probabilities(q_block, k_rows, row_mask, rows, start, size, causal)
                keys = probs.shape[-1]
                dv_rows[:, :keys] += torch.bmm(probs.transpose(1, 2), d_out)
                d_scores = torch.bmm(d_out, v_rows[:, :keys].transpose(1, 2))
                d_scores.sub_(row_terms.view(rows * kv_heads, -1, 1)).mul_(probs)
                dq[first:last, :, start:end] = torch.bmm(d_scores, k_rows[:, :keys]).view(rows, heads, size, d)
                dk_rows[:, :keys] += torch.bmm(d_scores.transpose(1, 2), q_block)
            dk[first:last] = dk_rows.view(rows, kv_heads, k_len, -1)
            dv[first:last] = dv_rows.view(rows, kv_heads, k_len, -1)
        return dq.mul_(ctx.scale), dk, dv, None, None


_packed_segments: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "tinker_packed_segments", default=None)


@contextlib.contextmanager
def packed_rows(lengths: Sequence[int]) -> Iterator[None]:
    """While active (in this thread), a one-row pass of ``sum(lengths)`` tokens is these rows packed end to end,
    each with positions from 0 (the caller passes them): ``attention`` computes each row's causal attention on its
    own. Without this, transformers' block-diagonal mask for those positions gives the same values, slower."""
    token = _packed_segments.set(tuple(lengths))
    try:
        yield
    finally:
        _packed_segments.reset(token)


_triangles: dict[torch.device, torch.Tensor] = {}


def _upper_triangle(device: torch.device) -> torch.Tensor:
    """-inf above the diagonal of a ``QUERY_BLOCK`` square (the keys a causal query must not see), 0 elsewhere."""
    if device not in _triangles:
        square = torch.zeros(QUERY_BLOCK, QUERY_BLOCK, device=device)
        _triangles[device] = square.masked_fill_(torch.ones_like(square, dtype=torch.bool).triu_(1), -math.inf)
    return _triangles[device]


def _fallback(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _usable_mask(mask: torch.Tensor, q_len: int, k_len: int) -> bool:
    """A boolean ``[b or 1, 1, n, m]`` mask under which every query sees some key (else softmax is undefined
    and SDPA's own convention applies)."""
    return (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[-2:] == (q_len, k_len)
            and bool(mask.any(-1).all()))


def _onednn_fp32_matmuls() -> bool:
    """Whether fp32 matmuls go to oneDNN now (inside ``device.fast_fp32_matmuls``), where SDPA's kernel is slow."""
    return torch.backends.mkldnn.matmul.fp32_precision != "none"  # type: ignore[attr-defined]  # not in the stubs


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention implementation: ``_AttentionFunction`` where it computes what SDPA would (a causal
    pass without a mask, or a boolean mask; fp32 CPU tensors; no dropout, softcap, sliding window or bias; at least
    ``MIN_QUERIES`` queries unless oneDNN's fp32 matmuls are on), else
    transformers' SDPA path itself. Masks come from transformers' SDPA mask function (registered alongside)."""
    q_len, k_len = query.shape[2], key.shape[2]
    plain_but_mask = (
        dropout == 0.0 and query.device.type == "cpu"
        and query.dtype == key.dtype == value.dtype == torch.float32
        and kwargs.get("sliding_window") is None and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None and not kwargs.get("output_attentions", False)
        and getattr(module, "is_causal", True) and kwargs.get("is_causal", True) is not False
        and query.shape[1] % key.shape[1] == 0 and key.shape[-1] == query.shape[-1]
        and (q_len >= MIN_QUERIES or _onednn_fp32_matmuls())
    )
    plain = plain_but_mask and (
        # SDPA without a mask crops longer keys to the queries (top-left causal); a mask is explicit.
        q_len == k_len if attention_mask is None else _usable_mask(attention_mask, q_len, k_len))
    segments = _packed_segments.get()
    if segments is not None and query.shape[0] == 1 and q_len == k_len == sum(segments) and plain_but_mask:
        # Rows packed into one sequence (``packed_rows``): transformers built their block-diagonal causal mask from
        # the restarting positions, which is exactly causal attention within each row. Computed so, row by row, a
        # row's queries never meet another row's keys (the mask would make every block scan all of them).
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        rows = zip(query.split(segments, 2), key.split(segments, 2), value.split(segments, 2), strict=True)
        return torch.cat([_AttentionFunction.apply(q, k, v, None, scale) for q, k, v in rows], dim=1), None
    if not plain:
        return _fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if attention_mask is not None:
        attention_mask = ~attention_mask.expand(-1, 1, q_len, k_len)  # True: masked out
    return _AttentionFunction.apply(query, key, value, attention_mask, scale), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


# -- the rotary embedding ----------------------------------------------------------------------------------


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """``x·cos + sign·rotate_half(x)·sin``, ``rotate_half(x) = (-x₂, x₁)`` (x₁, x₂ the two halves of the last
    dimension), in one product and two in-place multiply-adds on the halves."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-sign)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:], value=sign)
    return out


class _RotaryFunction(torch.autograd.Function):
    """HF's ``apply_rotary_pos_emb`` of ``q [b, h, n, d]`` and ``k [b, kv_h, n, d]`` by ``cos, sin [b, n, d]``.

    ``y = x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = (-x₂, x₁)``: per half, y₁ = x₁c₁ - x₂s₁ and
    y₂ = x₂c₂ + x₁s₂, so dx₁ = g₁c₁ + g₂s₂ and dx₂ = g₂c₂ - g₁s₁, the same form with ``-sin``: the backward is
    the rotation by the opposite angle. Saves only ``cos`` and ``sin`` (HF's autograd keeps products, a concatenation
    and slices, and its backward zero-fills and copies full-size slices).
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,  # type: ignore[override]
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        ctx.save_for_backward(cos, sin)
        return _rotate(q, cos, sin, 1.0), _rotate(k, cos, sin, 1.0)

    @staticmethod
    def backward(ctx: Any, grad_q: torch.Tensor, grad_k: torch.Tensor  # type: ignore[override]
                 ) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad_q, cos, sin, -1.0), _rotate(grad_k, cos, sin, -1.0), None, None


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb(q, k, cos, sin)`` (``q, k [b, heads, n, d]``, ``cos, sin [b, n, d]``) in one
    autograd node."""
    return _RotaryFunction.apply(q, k, cos, sin)


def _attention_forward(self: Any, hidden_states: torch.Tensor,
                       position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                       attention_mask: torch.Tensor | None = None, cache: Any = None,
                       **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The forward of HF's Llama/Qwen3 attention module with ``rotary`` for ``apply_rotary_pos_emb``: projections
    (Qwen3: each head's query and key RMS-normed first), rotation, cache update, the configured attention
    implementation, output projection. Anything else (another dtype, the deprecated ``past_key_values``) takes the
    module's own forward."""
    plain = position_embeddings is not None and hidden_states.dtype == torch.float32 and all(
        t.dtype == torch.float32 and t.dim() == 3 and t.shape[-1] == self.head_dim for t in position_embeddings)
    if position_embeddings is None or not plain or self.head_dim % 2 or "past_key_values" in kwargs:
        return getattr(self, _saved_forward)(hidden_states, position_embeddings=position_embeddings,
                                             attention_mask=attention_mask, cache=cache, **kwargs)
    cos, sin = position_embeddings
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    query, key = self.q_proj(hidden_states).view(shape), self.k_proj(hidden_states).view(shape)
    if getattr(self, "q_norm", None) is not None:
        query, key = self.q_norm(query), self.k_norm(key)
    value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    query, key = rotary(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    eager = sys.modules[type(self).__module__].eager_attention_forward
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
    if hasattr(self, "sliding_window"):  # Qwen3 passes its layer's window (None: full attention)
        kwargs = {**kwargs, "sliding_window": self.sliding_window}
    out, weights = interface(self, query, key, value, attention_mask,
                             dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
                             **kwargs)
    return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def _rope_is_plain(module: torch.nn.Module) -> bool:
    """Whether ``module`` has what ``_attention_forward`` uses (the HF classes of ``ATTENTION_CLASSES`` do)."""
    return all(hasattr(module, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling",
                                                  "layer_idx", "attention_dropout", "config"))


# -- installing --------------------------------------------------------------------------------------------


def _patch(module: torch.nn.Module, forward: Any) -> None:
    if _saved_forward not in module.__dict__:
        module.__dict__[_saved_forward] = module.forward
        module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]


def install(model: torch.nn.Module) -> int:
    """Route ``model``'s RMSNorms, SiLU MLPs and (for Llama/Qwen-style decoders) attention through the fused
    functions; returns how many modules changed. Exact to fp32 rounding; the HF path stays for what does not fit."""
    changed = 0
    for module in model.modules():
        name = type(module).__name__
        if name in NORM_CLASSES and hasattr(module, "variance_epsilon"):
            _patch(module, _norm_forward)
            changed += 1
        elif name in MLP_CLASSES and _is_silu(getattr(module, "act_fn", None)):
            _patch(module, _mlp_forward)
            changed += 1
        elif name in ATTENTION_CLASSES and _rope_is_plain(module):
            _patch(module, _attention_forward)
            changed += 1
    config: Any = getattr(model, "config", None)
    # Text decoders on transformers' SDPA only (what ``attention`` falls back to); a vision-language model keeps its
    # attention (its vision tower shares the config's setting).
    if (config is not None and getattr(config, "vision_config", None) is None
            and getattr(config, "_attn_implementation", None) == "sdpa"):
        _register_attention()
        config.__dict__["_tinker_previous_attn"] = config._attn_implementation
        config._attn_implementation = ATTENTION_NAME
        changed += 1
    return changed


def uninstall(model: torch.nn.Module) -> None:
    """Undo ``install``: the HF modules and attention implementation again."""
    for module in model.modules():
        if module.__dict__.pop(_saved_forward, None) is not None:
            del module.forward
    config: Any = getattr(model, "config", None)
    if config is not None and "_tinker_previous_attn" in config.__dict__:
        config._attn_implementation = config.__dict__.pop("_tinker_previous_attn")
