"""A sampler decode step whose element-wise work is compiled C (``decode_kernel.c``), for fp32 on CPU.

A batch-1 decode step of SmolLM2-135M in torch is ~1,000 calls of a few microseconds each, and on this kind of CPU
those calls, not the weights' memory traffic, took a third of the step. Here each layer is four matmuls (LoRA
updates included) and four calls into a small C library: add-residual + RMSNorm, q/k norms + rotary embedding + K/V
cache write + attention over the cache, add-residual + RMSNorm, SiLU·up.

The same library does the matmuls of up to ``MATMUL_MAX_ROWS`` rows (``matmul``, through ``sampling.decoder_model.Linear``):
it reads the weight in the layout oneDNN packed it in (checked per shape), so no second copy is held, and shares its
blocks of 64 outputs between the calling thread and helper threads. A batch-1 step is bound by reading the weights,
and one core does not saturate the memory bus. Larger matmuls (prefill, big decode batches) stay oneDNN's.

The library is compiled on first use with the system C compiler (``$CC``, else ``cc``) and cached under
``cache_dir()/kernels`` by a hash of its source, flags and compiler; where no compiler works the sampler keeps its
torch decode and oneDNN's matmuls (logged once). ``TINKER_COOKBOOK_DECODE_KERNEL=0`` turns both off (``1``: on, the
default), as does ``TINKER_COOKBOOK_COMPILED=0`` (see ``engine.settings``). Results equal the torch decode to fp32
rounding (``tests/engine/test_decode_kernel.py``, ``tests/engine/test_decode_matmul.py``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tinker_cookbook.base.assets import cache_dir
from tinker_cookbook.base.atomic_files import atomic_file
from tinker_cookbook.engine import settings
from tinker_cookbook.engine.kernels import onednn

if TYPE_CHECKING:
    from tinker_cookbook.engine.sampling.decode import SharedPrompts
    from tinker_cookbook.engine.sampling.decoder_model import DecoderWeights

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("decode_kernel.c")
# -ffp-contract=off: every product and sum rounded on its own, as torch's CPU kernels do.
_FLAGS = ["-O3", "-std=gnu11", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-math-errno"]
_MAX_HEAD_DIM = 1024

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float
_SIGNATURES = {
    "tc_add_rms_norm": [_P, _P, _P, _P, _I, _I, _F],
    "tc_silu_mul": [_P, _P, _I, _I],
    "tc_attend": [_P, _I, _I, _I, _I, _P, _F, _P, _P, _P, _F, _P, _P, _I, _I, _I, _P, _P, _P, _I, _I, _I, _P, _P,
                  _P, _P, _P],
    "tc_matmul": [_P, _I, _P, _P, _P, _I, _I, _I, _I],
}

_lock = threading.Lock()
_loaded: list[ctypes.CDLL | None] = []


def enabled() -> bool:
    """Whether the kernel may run (``settings.decode_kernel``: ``$TINKER_COOKBOOK_DECODE_KERNEL`` and
    ``$TINKER_COOKBOOK_COMPILED``, both 1 by default)."""
    return settings.decode_kernel()


def _compiler() -> str | None:
    for name in (settings.c_compiler(), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str) -> Path:
    """The compiled library, built once per source/flags/compiler and reused from the cache afterwards."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(_FLAGS).encode() + version.encode() + platform.machine().encode())
    folder = cache_dir() / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"decode-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    # Another process may build the same library at the same time: each writes its own file, then renames it.
    with atomic_file(target) as tmp:
        result = subprocess.run(
            [compiler, *_FLAGS, str(_SOURCE), "-o", str(tmp), "-lm"], capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
    return target


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built here (then the torch decode runs)."""
    with _lock:
        if not _loaded:
            _loaded.append(_load())
        return _loaded[0]


def _load() -> ctypes.CDLL | None:
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found ($CC, cc, gcc, clang): the sampler decodes with torch calls only")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        logger.warning("the decode kernel could not be built (%s): the sampler decodes with torch calls only", error)
        return None
    for name, argtypes in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = None
    return lib


# ----------------------------------------------------------------------------------------------------------------
# Matmuls of a few rows (``tc_matmul``)
# ----------------------------------------------------------------------------------------------------------------

MATMUL_MAX_ROWS = 128
"""Matmuls of up to this many rows (decode steps, short prompts) read the packed weight in ``tc_matmul``. On
SmolLM2-135M's weights, one thread of it streams them ~15% faster than oneDNN's packed kernel at 1-16 rows and two
threads 1.3-1.9x faster; up to 128 rows two threads of it still beat oneDNN's on two threads by 3-13%, and from
~256 rows (compute-bound: prefill) oneDNN's is the faster by 6-8% (``bench/bench_sampling.py``)."""

_BLOCK = 64


@dataclass(frozen=True)
class Blocked:
    """Where ``tc_matmul`` finds a packed fp32 weight ``[out, in]``: element (o, i) at ``address`` + 4 floats x
    ((o // 64) * stride + i * 64 + o % 64)."""

    address: int
    stride: int
    out_features: int
    in_features: int


_layout_lock = threading.Lock()
_layouts: dict[tuple[int, int], int | None] = {}
_thread_counts = threading.local()


def _packed_floats(packed: torch.Tensor) -> torch.Tensor:
    """The fp32 data of an opaque oneDNN tensor, as a flat tensor viewing it (valid while ``packed`` lives)."""
    count = torch.ops.mkldnn._nbytes(packed) // 4
    floats = (ctypes.c_float * count).from_address(torch.ops.mkldnn.data_ptr(packed))
    return torch.frombuffer(floats, dtype=torch.float32)


_INDEX_PROBE_MAX = 2**22
"""Weights of up to this many elements have their shape's layout checked once on index weights (a cheap probe);
larger ones are checked on their own values, which needs no probe copies of a large weight."""


def _block_view(flat: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor | None:
    """Packed data ``flat`` as ``[blocks, in, 64]`` (what ``tc_matmul`` reads: entry (b, i, j) is its weight
    element (b * 64 + j, i)), or None when its size does not fit that layout."""
    blocks = -(-out_features // _BLOCK)
    stride = flat.numel() // blocks
    if flat.numel() != blocks * stride or stride < in_features * _BLOCK:
        return None
    return flat.view(blocks, stride)[:, : in_features * _BLOCK].view(blocks, in_features, _BLOCK)


def _holds(view: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether every entry ``tc_matmul`` reads from ``view`` (``_block_view``) equals the weight element it stands
    for. Where it does, the matmul is exact for this weight whatever the packing was."""
    out_features, in_features = weight.shape
    full = out_features // _BLOCK
    whole = weight[: full * _BLOCK].view(full, _BLOCK, in_features).transpose(1, 2)
    if not torch.equal(view[:full], whole):
        return False
    rest = out_features - full * _BLOCK
    return rest == 0 or torch.equal(view[full, :, :rest], weight[full * _BLOCK :].T)


def _shape_stride(out_features: int, in_features: int) -> int | None:
    """The block stride of oneDNN's packing of fp32 ``[out, in]`` weights when it is the layout ``tc_matmul`` reads,
    else None. The layout depends on the shape (and the CPU), not on the values: checked on weights whose every
    element holds its own row (then column) index, exact in fp32 at these sizes."""
    o = torch.arange(out_features, dtype=torch.float32)[:, None].expand(out_features, in_features)
    i = torch.arange(in_features, dtype=torch.float32)[None, :].expand(out_features, in_features)
    strides = set()
    for index in (o, i):
        packed = onednn.pack(index, torch.float32)  # alive while viewed
        view = _block_view(_packed_floats(packed), out_features, in_features)
        if view is None or not _holds(view, index.contiguous()):
            return None
        strides.add(view.stride(0))
    return strides.pop() if len(strides) == 1 else None


def blocked(packed: torch.Tensor, weight: torch.Tensor) -> Blocked | None:
    """``tc_matmul``'s view of ``packed``, the fp32 ``weight`` packed by ``onednn.pack`` on CPU, or None
    where it cannot read it (another layout, the library not built here)."""
    out_features, in_features = weight.shape
    if packed.dtype != torch.float32 or weight.dtype != torch.float32 or library() is None:
        return None
    try:
        if out_features * in_features > _INDEX_PROBE_MAX:
            view = _block_view(_packed_floats(packed), out_features, in_features)
            stride = view.stride(0) if view is not None and _holds(view, weight) else None
        else:
            with _layout_lock:
                key = (out_features, in_features)
                if key not in _layouts:
                    _layouts[key] = _shape_stride(out_features, in_features)
                stride = _layouts[key]
    except (RuntimeError, AttributeError) as error:  # no oneDNN data access in this torch build
        logger.info("oneDNN's packed layout is not readable here (%s): decode matmuls stay oneDNN's", error)
        return None
    if stride is None:
        return None
    return Blocked(torch.ops.mkldnn.data_ptr(packed), stride, out_features, in_features)


def set_matmul_threads(count: int) -> None:
    """Threads for this thread's ``matmul`` calls (the caller plus ``count - 1`` helpers); by default
    ``torch.get_num_threads()`` at the call. The sampler's worker runs small decode steps' torch ops on one thread
    of its own and sets here the count its steps' matmuls may use."""
    _thread_counts.count = max(1, count)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_CPUS = _cpus()


def matmul_threads() -> int:
    """How many threads this thread's ``matmul`` calls use."""
    return min(getattr(_thread_counts, "count", 0) or torch.get_num_threads(), _CPUS)


def matmul(weight: Blocked, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x [rows, in] @ Wᵀ (+ bias)`` in fp32 for rows <= ``MATMUL_MAX_ROWS`` (fp32 rounding; sums in another order
    than oneDNN's), on up to ``set_matmul_threads`` threads, never more than the CPUs this process may use."""
    lib = library()
    assert lib is not None
    if x.dim() != 2 or x.shape[1] != weight.in_features or x.dtype != torch.float32:
        # The C code reads rows x in floats: anything else would read past the input.
        raise ValueError(f"matmul takes fp32 [rows, {weight.in_features}], got {x.dtype} {list(x.shape)}")
    if not x.is_contiguous():
        x = x.contiguous()
    rows = x.shape[0]
    out = torch.empty(rows, weight.out_features)
    threads = matmul_threads()
    lib.tc_matmul(
        weight.address, weight.stride, None if bias is None else bias.data_ptr(), x.data_ptr(), out.data_ptr(),
        rows, weight.in_features, weight.out_features, threads,
    )
    return out


# ----------------------------------------------------------------------------------------------------------------
# The decode step
# ----------------------------------------------------------------------------------------------------------------


def usable(weights: DecoderWeights) -> bool:
    """Whether ``decode`` below can run steps of ``weights``: fp32 on CPU, and the library is built here."""
    spec = weights.spec
    if weights.dtype != torch.float32 or weights.device.type != "cpu":
        return False
    if spec.head_dim > _MAX_HEAD_DIM or spec.head_dim % 2 or spec.num_heads % spec.num_kv_heads:
        return False
    return enabled() and library() is not None


def accepts(cache: torch.Tensor, shared: SharedPrompts | None) -> bool:
    """Whether ``decode`` can read and write these caches: fp32 with a contiguous head dim."""
    caches = [cache] if shared is None else [cache, shared.cache]
    return all(c.dtype == torch.float32 and c.device.type == "cpu" and c.stride(-1) == 1 for c in caches)


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


@torch.inference_mode()
def decode(
    weights: DecoderWeights,
    cache: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    shared: SharedPrompts | None = None,
    rope_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sampling.decode.decode`` (same arguments and result) with the element-wise work in the compiled library;
    call only where ``usable`` and ``accepts`` hold."""
    lib = library()
    assert lib is not None
    spec = weights.spec
    n, hidden, head_dim = tokens.shape[0], spec.hidden_size, spec.head_dim
    num_heads, num_kv = spec.num_heads, spec.num_kv_heads
    rope = (positions if rope_positions is None else rope_positions).to(torch.int64).contiguous()
    cos_table, sin_table = weights.rope_tables(int(rope.max()) + 1)
    if shared is None:
        local = positions.to(torch.int64).contiguous()
        prompt_slot = prompt_len = None
        prompt_base = p_layer = p_half = 0
        p_strides = (0, 0, 0)
        longest = int(local.max()) + 1
    else:
        prompt_slot = shared.of_row.to(torch.int64).contiguous()
        prompt_len = shared.lengths[prompt_slot].to(torch.int64).contiguous()
        local = (positions - prompt_len).contiguous()
        prompt_base = shared.cache.data_ptr()
        p_layer, p_half = 4 * shared.cache.stride(0), 4 * shared.cache.stride(1)
        p_strides = (shared.cache.stride(2), shared.cache.stride(3), shared.cache.stride(4))
        longest = int((local + 1 + prompt_len).max())
    strides = (cache.stride(2), cache.stride(3), cache.stride(4))
    # Byte offsets of layer i's K and V (and its prompts'): no per-layer view tensors.
    base, layer_bytes, half_bytes = cache.data_ptr(), 4 * cache.stride(0), 4 * cache.stride(1)
    h = weights.embed[tokens].float()  # indexing copies: h is this step's own buffer, updated in place below
    x = torch.empty_like(h)
    attn = torch.empty(n, num_heads * head_dim)
    act = torch.empty(n, spec.intermediate_size)
    scores = torch.empty(longest)
    tmp = torch.empty(head_dim)
    eps = spec.rms_eps
    q_scale = head_dim**-0.5
    # Pointers of the per-step buffers, read once: the loop below runs ~8 calls per layer.
    h_p, x_p, attn_p, act_p, scores_p, tmp_p = (t.data_ptr() for t in (h, x, attn, act, scores, tmp))
    rope_p, local_p, slot_p, len_p = rope.data_ptr(), local.data_ptr(), _ptr(prompt_slot), _ptr(prompt_len)
    cos_p, sin_p = cos_table.data_ptr(), sin_table.data_ptr()
    delta: torch.Tensor | None = None
    for index, layer in enumerate(weights.layers):
        lib.tc_add_rms_norm(h_p, _ptr(delta), layer.input_norm.data_ptr(), x_p, n, hidden, eps)
        qkv = layer.qkv.raw(x).contiguous()
        lib.tc_attend(
            qkv.data_ptr(), n, num_heads, num_kv, head_dim, _ptr(layer.qk_norm), eps, cos_p, sin_p, rope_p, q_scale,
            base + index * layer_bytes, base + index * layer_bytes + half_bytes, *strides, local_p,
            prompt_base + index * p_layer if shared is not None else None,
            prompt_base + index * p_layer + p_half if shared is not None else None,
            *p_strides, slot_p, len_p, attn_p, scores_p, tmp_p,
        )
        out = layer.o_proj.raw(attn).contiguous()
        lib.tc_add_rms_norm(h_p, out.data_ptr(), layer.post_norm.data_ptr(), x_p, n, hidden, eps)
        gate_up = layer.gate_up.raw(x).contiguous()
        lib.tc_silu_mul(gate_up.data_ptr(), act_p, n, spec.intermediate_size)
        delta = layer.down.raw(act)
    if delta is not None:
        h += delta
    return h
