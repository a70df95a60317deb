"""The hand-fused RMSNorm, SiLU·up and attention (``engine/training/fused_layers.py``) against float64 references and against
the Hugging Face path in whole LoRA training steps (Llama- and Qwen3-shaped tiny models), at 1, 2 and 4 threads."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from tinker_cookbook.engine import device as device_module
from tinker_cookbook.engine import settings
from tinker_cookbook.engine.models import get_model_spec, load_model
from tinker_cookbook.engine.training import fused_layers
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types

FP32_UNIT = 2.0**-24
THREADS = [1, 2, 4]


@pytest.fixture(params=THREADS)
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _within(value: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor | float) -> bool:
    return bool(((value.double() - reference).abs() <= bound).all())


def test_rms_norm_matches_float64(threads: int) -> None:
    """Forward and input gradient of the fused RMSNorm against the HF formula in float64.

    Per element the forward is a few roundings of the row statistics (a sum of n=96 squares: γ_n relative) and
    two products; the gradient adds one dot product of n terms. Bounds: (n + 8)·u relative to the magnitudes that
    enter (|w·x·r| forward; r·|w·dy| + r³·|x|·Σ|w·dy·x|/n backward).
    """
    generator = torch.Generator().manual_seed(0)
    n = 96
    x = (torch.randn(4, 33, n, generator=generator) * 3).requires_grad_(True)
    weight = torch.rand(n, generator=generator) + 0.5
    upstream = torch.randn(4, 33, n, generator=generator)
    out = fused_layers.rms_norm(x, weight, 1e-6)
    out.backward(upstream)
    assert x.grad is not None

    x64 = x.detach().double().requires_grad_(True)
    w64 = weight.double()
    ref = w64 * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6))
    ref.backward(upstream.double())
    assert x64.grad is not None
    rstd = torch.rsqrt(x64.detach().pow(2).mean(-1, keepdim=True) + 1e-6)
    unit = (n + 8) * FP32_UNIT
    assert _within(out.detach(), ref.detach(), unit * ref.detach().abs() + 1e-30)
    scaled = (w64 * upstream.double()).abs()
    grad_scale = rstd * scaled + rstd.pow(3) * x64.detach().abs() * (scaled * x64.detach().abs()).sum(-1, True) / n
    assert _within(x.grad, x64.grad, unit * grad_scale + 1e-30)


def test_silu_mul_matches_float64(threads: int) -> None:
    """silu(gate)·up and both input gradients against float64: a handful of roundings per element (the sigmoid's
    exp and division, two or three products), so 16·u relative to the magnitudes of the terms."""
    generator = torch.Generator().manual_seed(1)
    gate = (torch.randn(5, 17, 64, generator=generator) * 4).requires_grad_(True)
    up = torch.randn(5, 17, 64, generator=generator).requires_grad_(True)
    upstream = torch.randn(5, 17, 64, generator=generator)
    out = fused_layers.silu_mul(gate, up)
    out.backward(upstream)
    g64, u64 = gate.detach().double().requires_grad_(True), up.detach().double().requires_grad_(True)
    ref = F.silu(g64) * u64
    ref.backward(upstream.double())
    assert gate.grad is not None and up.grad is not None and g64.grad is not None and u64.grad is not None
    unit = 16 * FP32_UNIT
    sig = torch.sigmoid(g64.detach())
    assert _within(out.detach(), ref.detach(), unit * ref.detach().abs() + 1e-30)
    assert _within(up.grad, u64.grad, unit * u64.grad.abs() + 1e-30)
    gate_scale = (upstream.double() * u64.detach()).abs() * sig * (1 + g64.detach().abs() * (1 - sig))
    assert _within(gate.grad, g64.grad, unit * gate_scale + 1e-30)


def test_rotary_matches_float64(threads: int) -> None:
    """The rotation of q and k (HF's ``apply_rotary_pos_emb``, run in float64 as the reference) and its gradient.

    Each output element is ``x_i·c_i ± x_j·s_i``: two products and a sum, three roundings, and so is each gradient
    element (``g_i·c_i ∓ g_j·s_j``); 4·u relative to the magnitudes of the two terms bounds both.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(7)
    batch, n, d = 2, 33, 16
    # HF's layout: projections [b, n, heads, d] seen as [b, heads, n, d].
    q = torch.randn(batch, n, 6, d, generator=generator).transpose(1, 2).requires_grad_(True)
    k = torch.randn(batch, n, 2, d, generator=generator).transpose(1, 2).requires_grad_(True)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
    angles = torch.cat([angles, angles], -1).expand(batch, n, d)
    cos, sin = angles.cos().float(), angles.sin().float()
    up_q, up_k = torch.randn(q.shape, generator=generator), torch.randn(k.shape, generator=generator)
    out_q, out_k = fused_layers.rotary(q, k, cos, sin)
    (out_q * up_q).sum().add((out_k * up_k).sum()).backward()
    assert q.grad is not None and k.grad is not None

    q64, k64 = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    ref_q, ref_k = apply_rotary_pos_emb(q64, k64, cos.double(), sin.double())
    (ref_q * up_q.double()).sum().add((ref_k * up_k.double()).sum()).backward()
    assert q64.grad is not None and k64.grad is not None

    def swap(x: torch.Tensor) -> torch.Tensor:  # the partner element of each: the other half
        return torch.cat([x[..., d // 2:], x[..., : d // 2]], -1)

    c, s_ = cos.double().abs().unsqueeze(1), sin.double().abs().unsqueeze(1)
    unit = 4 * FP32_UNIT
    for out, ref, x, up, grad, ref_grad in ((out_q, ref_q, q64, up_q, q.grad, q64.grad),
                                            (out_k, ref_k, k64, up_k, k.grad, k64.grad)):
        x_abs, up_abs = x.detach().abs(), up.double().abs()
        assert _within(out.detach(), ref.detach(), unit * (x_abs * c + swap(x_abs) * s_) + 1e-30)
        assert _within(grad, ref_grad, unit * (up_abs * c + swap(up_abs * s_)) + 1e-30)


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                         scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention [b, n, h, d] and its probabilities, the key/value heads repeated for their query heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, -math.inf)
    probs = torch.softmax(scores, -1)
    return (probs @ v).transpose(1, 2), probs


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("batch", "n", "kv_heads"), [(2, 300, 2), (5, 100, 2), (4, 60, 6)])
def test_attention_matches_float64(threads: int, masked: bool, batch: int, n: int, kv_heads: int,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Causal and boolean-masked (a shared prefix's shape: fewer queries than keys) grouped-query attention, output
    and q/k/v gradients, against float64: long rows in several query blocks, one row at a time, and short rows
    batched several at a time (5 rows of 100: chunks of 3 and 2 rows causal, 2, 2 and 1 masked); grouped-query
    (3 query heads per key/value head) and plain multi-head (4 rows of 60, one chunk).

    Rounding per output element: the scores are d-term sums (γ_d), exp and the softmax's m-term normalising sum
    (γ_m), then an m-term sum against V; an error ε in a score moves the output by ≤ ε·Σ_j P_j·|V_j - O|. So the
    bound is (2d + 2m + 16)·u·scale·Σ|q||k|-weighted terms; we use the simpler (2d + 2m + 16)·u·(1 + max|s|)·Σ_j
    P_j·|V_j| (max|s| the largest score magnitude, covering the relative error of exp) for the output, and the
    same factor times the matching products of magnitudes for the gradients.
    """
    monkeypatch.setattr(fused_layers, "MIN_QUERIES", 1)  # the fused function at every length, whatever the BLAS
    generator = torch.Generator().manual_seed(2)
    heads, d = 6, 16
    m = n + 40 if masked else n
    q = torch.randn(batch, n, heads, d, generator=generator).transpose(1, 2).requires_grad_(True)
    k = torch.randn(batch, m, kv_heads, d, generator=generator).transpose(1, 2).requires_grad_(True)
    v = torch.randn(batch, m, kv_heads, d, generator=generator).transpose(1, 2).requires_grad_(True)
    upstream = torch.randn(batch, n, heads, d, generator=generator)
    scale = d**-0.5
    allowed = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
    # One mask per row for the long rows, one broadcast over all rows for the short ones (both occur).
    mask = allowed.expand(batch if n > 128 else 1, 1, n, m) if masked else None
    module = torch.nn.Module()
    out, _ = fused_layers.attention(module, q, k, v, mask, scaling=scale)
    assert type(out.grad_fn).__name__ == "_AttentionFunctionBackward"
    out.backward(upstream)
    assert q.grad is not None and k.grad is not None and v.grad is not None

    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref, probs = _reference_attention(q64, k64, v64, allowed, scale)
    ref.backward(upstream.double())
    assert q64.grad is not None and k64.grad is not None and v64.grad is not None
    with torch.no_grad():
        group = heads // kv_heads
        k_abs, v_abs = k64.abs().repeat_interleave(group, 1), v64.abs().repeat_interleave(group, 1)
        max_score = float((q64 @ k64.repeat_interleave(group, 1).transpose(-1, -2)).abs().max()) * scale
        unit = (2 * d + 2 * m + 16) * FP32_UNIT * (1 + max_score)
        assert _within(out.detach(), ref, unit * (probs @ v_abs).transpose(1, 2) + 1e-30)
        # dP = dO·Vᵀ, dS = P·(dP - <dO, O>); |dS| ≤ P·(|dO|·|V| + |<dO, O>|) elementwise.
        d_out = upstream.double().transpose(1, 2)
        d_probs = d_out.abs() @ v_abs.transpose(-1, -2) + (d_out * ref.transpose(1, 2)).sum(-1, True).abs()
        d_scores = probs * d_probs
        q_bound = unit * scale * (d_scores @ k_abs)
        k_bound = unit * scale * (d_scores.transpose(-1, -2) @ q64.abs()).view(batch, kv_heads, group, m, d).sum(2)
        v_bound = unit * (probs.transpose(-1, -2) @ d_out.abs()).view(batch, kv_heads, group, m, d).sum(2)
        assert _within(q.grad, q64.grad, q_bound + 1e-30)
        assert _within(k.grad, k64.grad, k_bound + 1e-30)
        assert _within(v.grad, v64.grad, v_bound + 1e-30)


def test_attention_falls_back_where_it_does_not_apply() -> None:
    """A float mask (or dropout, a sliding window...) goes to transformers' SDPA path: the same values as SDPA."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=generator) for _ in range(3))
    float_mask = torch.zeros(1, 1, 10, 10).masked_fill_(torch.ones(10, 10, dtype=torch.bool).triu(1), -math.inf)
    out, _ = fused_layers.attention(torch.nn.Module(), q, k, v, float_mask, scaling=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, scale=0.3).transpose(1, 2)
    assert torch.equal(out, expected)


def test_short_attention_passes_keep_sdpa() -> None:
    """Below ``MIN_QUERIES`` queries, with fp32 matmuls on torch's BLAS, the pass is SDPA's own (bit for bit), where
    the fused loop would be slower."""
    generator = torch.Generator().manual_seed(5)
    n = fused_layers.MIN_QUERIES - 1
    q, k, v = (torch.randn(1, 2, n, 8, generator=generator) for _ in range(3))
    out, _ = fused_layers.attention(torch.nn.Module(), q, k, v, None, scaling=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3).transpose(1, 2)
    assert torch.equal(out, expected)


def test_short_attention_passes_are_fused_under_onednn_fp32_matmuls() -> None:
    """Inside ``fast_fp32_matmuls`` (every training pass where oneDNN's fp32 kernels are exact) SDPA's kernel is
    slower than the fused function at every length, so a short pass is fused too."""
    if not device_module._onednn_fp32_is_exact():
        pytest.skip("oneDNN's fp32 matmuls are not exact on this CPU: training keeps torch's BLAS")
    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(3, 2, 20, 8, generator=generator).requires_grad_(True) for _ in range(3))
    with device_module.fast_fp32_matmuls(torch.device("cpu")):
        out, _ = fused_layers.attention(torch.nn.Module(), q, k, v, None, scaling=0.3)
    assert type(out.grad_fn).__name__ == "_AttentionFunctionBackward"
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3).transpose(1, 2)
    # Same function: fp32 rounding of 20-term sums of products of magnitude ~1 (see the float64 test's bound).
    assert float((out - expected).abs().max()) < 1e-5


def _session(model: str, fused: bool, monkeypatch: pytest.MonkeyPatch) -> TrainingSession:
    monkeypatch.setattr(settings, "FUSED_LAYERS", fused)
    base = BaseModel(get_model_spec(model), load_model(model, torch.float32), torch.float32)
    return TrainingSession(f"fused-{fused}", base, types.LoraConfig(rank=8, seed=5, train_unembed=True))


def _data() -> list[types.Datum]:
    """Rows long enough for several attention query blocks, of lengths that make two length groups."""
    generator = torch.Generator().manual_seed(4)
    rows = [torch.randint(10, 1000, (n,), generator=generator).tolist() for n in (9, 40, 290, 300)]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(r[:-1]),
            loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0 / len(r)] * (len(r) - 1)},
        )
        for r in rows
    ]


def _logprobs(output: types.ForwardBackwardOutput) -> torch.Tensor:
    return torch.cat([torch.tensor(o["logprobs"].tolist(), dtype=torch.float64) for o in output.loss_fn_outputs])


@pytest.mark.parametrize("model", ["tinker-cookbook/tiny-smollm2", "tinker-cookbook/tiny-qwen3"])
def test_lora_step_through_fused_layers_equals_the_hf_path(device: str, model: str, threads: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Same logprobs, LoRA gradients and post-step logprobs with and without the fused layers.

    Both paths compute the same function in fp32 and differ only in the order of sums and in which fp32
    intermediates are rounded (~1e-7 relative per op). Through a 2-layer model and a log-softmax over the
    vocabulary that stays around 1e-6 in logprobs and gradients (measured: ~1e-6); 1e-4 in logprobs (the
    sampler/learner agreement bound) and 1e-4 of each gradient's norm leave a wide margin and still catch a real
    difference (a wrong mask or a missing term moves them by >= 1e-2).
    """
    if device != "cpu":
        pytest.skip("the fused layers are a CPU path; other devices never install them")
    hf, fused = _session(model, False, monkeypatch), _session(model, True, monkeypatch)
    assert fused.base._model.config._attn_implementation == fused_layers.ATTENTION_NAME
    assert hf.base._model.config._attn_implementation != fused_layers.ATTENTION_NAME
    data = _data()
    outputs = [s.forward(data, "cross_entropy", None, backward=True) for s in (hf, fused)]
    assert float((_logprobs(outputs[0]) - _logprobs(outputs[1])).abs().max()) < 1e-4
    for key, p in hf.params.items():
        q = fused.params[key]
        assert p.grad is not None and q.grad is not None
        assert float((p.grad - q.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-12, key
    for s in (hf, fused):
        s.optim_step(types.AdamParams(learning_rate=1e-3))
    after = [_logprobs(s.forward(data, "cross_entropy", None, backward=False)) for s in (hf, fused)]
    assert float((after[0] - after[1]).abs().max()) < 1e-4
    assert float((after[0] - _logprobs(outputs[0])).abs().max()) > 1e-3  # the step changed the model


@pytest.mark.parametrize("model_name", ["tinker-cookbook/tiny-smollm2", "tinker-cookbook/tiny-qwen3"])
def test_install_routes_every_layer_through_the_fused_functions(model_name: str, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """The whole-step comparison above cannot tell a fused function from the HF path it replaces (same values):
    here each one must run, once per decoder layer (the rotation and attention) or per norm and MLP."""
    model = load_model(model_name, torch.float32)
    fused_layers.install(model)
    calls: dict[str, int] = {}
    for name in ("rotary", "rms_norm", "silu_mul"):
        original = getattr(fused_layers, name)

        def spy(*args: object, _name: str = name, _original: object = original) -> object:
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args)  # type: ignore[operator]

        monkeypatch.setattr(fused_layers, name, spy)
    layers = model.config.num_hidden_layers
    norms = sum(1 for m in model.modules() if type(m).__name__ in fused_layers.NORM_CLASSES)
    with torch.no_grad():
        model(input_ids=torch.arange(10, 30)[None], use_cache=False)
    assert calls == {"rotary": layers, "rms_norm": norms, "silu_mul": layers}


def test_uninstall_restores_the_hf_modules() -> None:
    model = load_model("tinker-cookbook/tiny-qwen3", torch.float32)
    before = model.config._attn_implementation
    assert fused_layers.install(model) > 0
    assert model.config._attn_implementation == fused_layers.ATTENTION_NAME
    fused_layers.uninstall(model)
    assert model.config._attn_implementation == before
    assert not any("forward" in m.__dict__ for m in model.modules())
