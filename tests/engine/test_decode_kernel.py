"""The compiled decode step (``engine/decode_kernel``) against the torch decode, and its build and fallback rules."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sampler_models import stored_prompts, tiny_llama, tiny_qwen2, tiny_qwen3

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.kernels import decode_kernel
from tinker_cookbook.engine.sampling import decode as sampler_decode
from tinker_cookbook.engine.sampling import decoder_model as sampler_model
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

MAKERS = [tiny_qwen3, tiny_llama, tiny_qwen2]
IDS = ["qwen3-qk-norm", "llama3-rope-tied", "qwen2-qkv-bias"]


@pytest.fixture(autouse=True)
def cpu_with_a_compiler(device: str) -> None:
    if device != "cpu":
        pytest.skip("the compiled decode is CPU-only")
    if decode_kernel._compiler() is None:
        pytest.skip("no C compiler on this machine (the torch decode runs, tested by test_sampler_decoder)")
    assert decode_kernel.library() is not None, "a C compiler exists but the decode kernel did not build"


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty kernel cache and no library loaded yet; the loaded one comes back afterwards."""
    monkeypatch.setenv("TINKER_COOKBOOK_CACHE", str(tmp_path))
    saved = list(decode_kernel._loaded)
    decode_kernel._loaded.clear()
    yield tmp_path / "kernels"
    decode_kernel._loaded[:] = saved


def _decode_both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], torch.Tensor]) -> tuple[Any, Any]:
    monkeypatch.setenv(settings.DECODE_KERNEL_ENV, "1")
    compiled = run()
    monkeypatch.setenv(settings.DECODE_KERNEL_ENV, "0")
    return compiled, run()


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
def test_compiled_decode_equals_torch_decode_with_shared_prompts(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five rows continuing three stored prompts (lengths 7, 4, 11; one prompt slot unused), rotary positions
    shifted as after an image, four steps: hidden states and the K/V written equal the torch decode's.

    Same fp32 operations, each rounded on its own; only the order of the dot products' and the softmax's sums
    differs (16 partial sums against torch's kernels): a few ulp per operation over two layers, bound 1e-5 of the
    largest value (measured ~1e-6).
    """
    model = make()
    weights = SamplingWeights.build(model.config, model.state_dict(), None, None, torch.float32).decoder
    assert decode_kernel.usable(weights)
    spec = weights.spec
    _, shared = stored_prompts(weights, [2, 0, 2, 0, 2])
    of_row, lengths = shared.of_row, shared.lengths
    caches = {mode: torch.zeros(spec.num_layers, 2, 5, spec.num_kv_heads, 8, spec.head_dim) for mode in "10"}
    positions = lengths[of_row].clone()
    for step in range(4):
        tokens = torch.tensor([7 + 13 * row + step for row in range(5)])

        def run(positions: torch.Tensor = positions, tokens: torch.Tensor = tokens, step: int = step) -> Any:
            cache = caches[os.environ[settings.DECODE_KERNEL_ENV]]
            return sampler_decode.decode(weights, cache, tokens, positions, step + 1, shared, positions + 5)

        compiled, reference = _decode_both(monkeypatch, run)
        torch.testing.assert_close(compiled, reference, atol=1e-5 * float(reference.abs().max()), rtol=0)
        positions += 1
    torch.testing.assert_close(caches["1"], caches["0"], atol=1e-5 * float(caches["0"].abs().max()), rtol=0)


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
def test_compiled_decode_equals_torch_decode_with_own_caches(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sequences at different positions in their own cache slots (no shared prompts), as in the HF check of
    test_sampler_decoder: the same hidden states (bound as above) and the same greedy tokens over three steps."""
    model = make()
    weights = SamplingWeights.build(model.config, model.state_dict(), None, None, torch.float32).decoder
    spec = weights.spec
    prompts = [[5, 17, 300, 9, 44, 1000, 7], [12, 8, 100, 2000]]
    result = sampler_model.prefill(weights, prompts, torch.float32)
    start = torch.zeros(spec.num_layers, 2, 2, spec.num_kv_heads, 16, spec.head_dim)
    for slot, kv in enumerate(result.kv):
        start[:, :, slot, :, : kv.shape[3]] = kv

    def run() -> list[torch.Tensor]:
        cache, tokens, positions, states = start.clone(), torch.tensor([3, 4]), torch.tensor([7, 4]), []
        for _ in range(3):
            hidden = sampler_decode.decode(weights, cache, tokens, positions, int(positions.max()) + 1)
            states.append(hidden)
            tokens = sampler_model.logits(weights, hidden).argmax(-1)
            positions = positions + 1
        return states

    compiled, reference = _decode_both(monkeypatch, run)
    for got, expected in zip(compiled, reference, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5 * float(expected.abs().max()), rtol=0)


def test_sampler_engine_samples_the_same_with_and_without_the_kernel(
    engine: SamplerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the sampler engine (one batch of 3 samples of one prompt plus a second prompt): the same greedy
    tokens and the same logprobs (fp32 rounding, bound 1e-4 like the sampler's other fp32 logprob checks)."""
    weights = SamplingWeights.build(tiny_qwen3().config, tiny_qwen3().state_dict(), None, None, torch.float32)
    params = types.SamplingParams(max_tokens=12, temperature=0.0)

    def run() -> list[types.SampleResponse]:
        futures = [
            engine.submit(weights, None, types.ModelInput.from_ints(prompt), samples, params)
            for prompt, samples in (([5, 17, 300, 9, 44], 3), ([12, 8, 100, 2000, 6, 6, 1], 1))
        ]
        return [f.result(timeout=120) for f in futures]

    compiled, reference = _decode_both(monkeypatch, run)
    for got, expected in zip(compiled, reference, strict=True):
        for a, b in zip(got.sequences, expected.sequences, strict=True):
            assert a.tokens == b.tokens
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_a_bad_switch_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.DECODE_KERNEL_ENV, "yes")
    with pytest.raises(BadRequestError, match="TINKER_COOKBOOK_DECODE_KERNEL='yes'.*set it to 1"):
        decode_kernel.enabled()
    monkeypatch.setenv(settings.DECODE_KERNEL_ENV, "0")
    weights = SamplingWeights.build(tiny_qwen3().config, tiny_qwen3().state_dict(), None, None, torch.float32)
    assert not decode_kernel.usable(weights.decoder)


def test_the_library_is_built_once_and_reused(fresh_library: Path) -> None:
    assert decode_kernel.library() is not None
    (built,) = fresh_library.glob("decode-*.so")
    stamp = built.stat().st_mtime_ns
    decode_kernel._loaded.clear()
    assert decode_kernel.library() is not None
    assert [p.name for p in fresh_library.iterdir()] == [built.name]  # no second build, no temporary file left
    assert built.stat().st_mtime_ns == stamp


def test_without_a_compiler_the_torch_decode_runs(
    fresh_library: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(decode_kernel, "_compiler", lambda: None)
    with caplog.at_level(logging.INFO, logger=decode_kernel.__name__):
        weights = SamplingWeights.build(tiny_qwen3().config, tiny_qwen3().state_dict(), None, None, torch.float32)
        assert not decode_kernel.usable(weights.decoder)
    assert all(layer.qkv.blocked is None for layer in weights.decoder.layers)  # oneDNN's matmuls, too
    assert "no C compiler found" in caplog.text
    with SamplerEngine() as engine:
        response = engine.submit(
            weights, None, types.ModelInput.from_ints([5, 17, 300]), 1, types.SamplingParams(max_tokens=4)
        ).result(timeout=120)
    assert len(response.sequences[0].tokens) == 4


def test_a_failed_build_is_logged_and_leaves_nothing_behind(
    fresh_library: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(decode_kernel, "_SOURCE", broken)
    with caplog.at_level(logging.WARNING, logger=decode_kernel.__name__):
        assert decode_kernel.library() is None
    assert "could not be built" in caplog.text and "failed" in caplog.text
    assert list(fresh_library.iterdir()) == []
