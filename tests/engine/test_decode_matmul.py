"""The compiled few-row matmul (``decode_kernel.matmul``, ``tc_matmul`` in ``decode_kernel.c``): oneDNN's packed
fp32 layout read right, every row count and block remainder, its helper threads (oversubscribed, concurrent
callers, after a fork), and the sampler worker's thread count for it."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest
import torch
from sampler_models import tiny_qwen3

from tests.engine.test_decode_kernel import cpu_with_a_compiler  # noqa: F401 - the module's autouse fixture
from tinker_cookbook.engine import settings
from tinker_cookbook.engine.kernels import decode_kernel, onednn
from tinker_cookbook.engine.sampling.decoder_model import Linear
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.tinker import types

# (out, in): whole blocks of 64 outputs, a partial last block, an input count oneDNN pads, a single block.
# oneDNN picks its blocking per shape and CPU: on AVX2-only CPUs it lays out e.g. 192 outputs in blocks of another
# width, which the kernel rightly refuses (blocked None, oneDNN computes); these shapes get 64-blocks on both kinds.
SHAPES = [(256, 64), (100, 70), (33, 17), (64, 48)]


@pytest.fixture(autouse=True)
def packing_works() -> None:
    if not onednn.can_pack(torch.float32):
        pytest.skip("oneDNN fp32 packing does not work in this torch build")


def _bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Rounding bound of an fp32 dot product of length n summed in any order, with or without fused multiply-adds:
    n * 2^-24 * sum |x_i w_i| (+ the bias add), per output (Higham, Accuracy and Stability, 3.1)."""
    n = x.shape[1] + 1
    magnitude = x.double().abs() @ weight.double().abs().T
    if bias is not None:
        magnitude += bias.double().abs()
    return n * 2.0**-24 * magnitude + 1e-30


def _check(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    reference = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    excess = (out.double() - reference).abs() - _bound(x, weight, bias)
    assert out.shape == reference.shape and float(excess.max()) <= 0, float(excess.max())


def _raw_matmul(linear: Linear, x: torch.Tensor, threads: int) -> torch.Tensor:
    """``tc_matmul`` with an explicit thread count: more threads than this machine has CPUs, too."""
    lib, blocked = decode_kernel.library(), linear.blocked
    assert lib is not None and blocked is not None
    out = torch.full((x.shape[0], blocked.out_features), float("nan"))  # an output left unwritten shows
    bias = None if linear.bias is None else linear.bias.data_ptr()
    lib.tc_matmul(blocked.address, blocked.stride, bias, x.data_ptr(), out.data_ptr(), x.shape[0],
                  blocked.in_features, blocked.out_features, threads)
    return out.clone()  # the output as it was on return, not after a late helper wrote to it


@pytest.fixture(params=["shape-probe", "own-values"])
def layout_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Small weights have their shape's layout probed once; large ones are checked on their own values: both."""
    if request.param == "own-values":
        monkeypatch.setattr(decode_kernel, "_INDEX_PROBE_MAX", 0)
    return str(request.param)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{o}x{i}" for o, i in SHAPES])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_every_row_count_and_thread_count_matches_float64(
    shape: tuple[int, int], with_bias: bool, layout_check: str
) -> None:
    """Rows 1..17 (one to five groups of four, every remainder), 31, 64 and the limit, on 1, 2 and 3 threads:
    within the rounding bound of each output's dot product. A misread layout or a dropped or doubled block is off
    by O(1)."""
    generator = torch.Generator().manual_seed(sum(shape))
    out_features, in_features = shape
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    linear = Linear.of(weight, bias)
    if linear.blocked is None and decode_kernel._shape_stride(out_features, in_features) is None:
        pytest.skip(f"oneDNN packs {out_features}x{in_features} in another layout on this CPU (the kernel is unused)")
    assert linear.blocked is not None, "oneDNN's packed fp32 layout was not recognised"
    for rows in [*range(1, 18), 31, 64, decode_kernel.MATMUL_MAX_ROWS]:
        x = torch.randn(rows, in_features, generator=generator)
        _check(linear.raw(x), x, weight, bias)
        for threads in (1, 2, 3):
            _check(_raw_matmul(linear, x, threads), x, weight, bias)


def test_more_rows_than_the_limit_go_to_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = torch.randn(128, 64)
    linear = Linear.of(weight, None)
    calls: list[int] = []
    real = decode_kernel.matmul
    monkeypatch.setattr(decode_kernel, "matmul", lambda *a: calls.append(a[2].shape[0]) or real(*a))
    for rows in (1, decode_kernel.MATMUL_MAX_ROWS, decode_kernel.MATMUL_MAX_ROWS + 1):
        x = torch.randn(rows, 64)
        _check(linear.raw(x), x, weight, None)
    assert calls == [1, decode_kernel.MATMUL_MAX_ROWS]
    assert linear.blocked is not None
    with pytest.raises(ValueError, match=r"fp32 \[rows, 64\]"):  # a width the C code would read past
        real(linear.blocked, None, torch.randn(1, 63))
    monkeypatch.setenv(settings.DECODE_KERNEL_ENV, "0")  # the switch turns these matmuls off too
    linear.raw(torch.randn(1, 64))
    assert calls == [1, decode_kernel.MATMUL_MAX_ROWS]


def test_a_layout_other_than_the_one_read_is_refused(monkeypatch: pytest.MonkeyPatch, layout_check: str) -> None:
    """The layout check is live: expecting blocks of 32 outputs (which oneDNN does not use here) finds no match,
    and the Linear keeps oneDNN's matmul. bf16 packed weights are never read."""
    monkeypatch.setattr(decode_kernel, "_layouts", {})
    monkeypatch.setattr(decode_kernel, "_BLOCK", 32)
    assert Linear.of(torch.randn(128, 64), None).blocked is None
    monkeypatch.setattr(decode_kernel, "_BLOCK", 64)
    decode_kernel._layouts.clear()  # the per-shape cache (this test's own) remembered the refusal
    assert Linear.of(torch.randn(128, 64), None).blocked is not None
    if onednn.can_pack(torch.bfloat16):
        assert Linear.of(torch.randn(128, 64).bfloat16(), None).blocked is None


def test_the_caller_waits_for_the_blocks_its_helpers_are_on() -> None:
    """Two blocks of 64 outputs, each a long stream (8192 inputs): the caller finishes its block while a helper is
    still in the other one; the result must include it every time (a caller that returns early fails here)."""
    generator = torch.Generator().manual_seed(5)
    weight, x = torch.randn(128, 8192, generator=generator), torch.randn(1, 8192, generator=generator)
    linear = Linear.of(weight, None)
    # Back to back, checked afterwards: between slower calls an idle helper goes to sleep and joins too late.
    results = [_raw_matmul(linear, x, 2) for _ in range(100)]
    for out in results:
        _check(out, x, weight, None)


def test_concurrent_callers_share_the_helpers_safely() -> None:
    """Three threads, each with its own weight, 200 matmuls each on 3 threads: one caller holds the helpers at a
    time, the others run alone; every result is right (a result mixed with another job's would not be)."""
    generator = torch.Generator().manual_seed(3)
    shapes = [(640, 96), (200, 64), (1000, 33)]
    weights = [torch.randn(o, i, generator=generator) for o, i in shapes]
    linears = [Linear.of(w, None) for w in weights]
    inputs = [torch.randn(3, i, generator=generator) for _, i in shapes]
    failures: list[BaseException] = []

    def hammer(index: int) -> None:
        try:
            for _ in range(200):
                _check(_raw_matmul(linears[index], inputs[index], 3), inputs[index], weights[index], None)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures and not any(thread.is_alive() for thread in threads)


_FORK_LINEAR: list[Linear] = []


def _matmul_in_child(queue: Any) -> None:
    # Only the C library and torch.empty here: GNU OpenMP's pool is not usable in a forked child.
    out = _raw_matmul(_FORK_LINEAR[0], torch.ones(2, 64), 2)
    queue.put(set(out.flatten().tolist()) == {64.0})


def test_a_forked_child_runs_matmuls_without_the_parents_helpers() -> None:
    """The parent's helper threads do not exist in a forked child; its matmuls start a pool of their own (or run
    alone) instead of waiting forever for them."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    _FORK_LINEAR[:] = [Linear.of(torch.ones(640, 64), None)]
    _raw_matmul(_FORK_LINEAR[0], torch.ones(2, 64), 2)  # helpers running in this process
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_matmul_in_child, args=(queue,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and queue.get(timeout=5) is True


def test_the_sampler_worker_gives_its_matmuls_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch-1 step runs its torch ops on one thread of the worker's own, but its matmuls on the process's
    count (capped at the CPUs this process may use)."""
    seen: list[tuple[int, int]] = []
    real = decode_kernel.matmul

    def spy(*args: Any) -> torch.Tensor:
        seen.append((torch.get_num_threads(), decode_kernel.matmul_threads()))
        return real(*args)

    monkeypatch.setattr(decode_kernel, "matmul", spy)
    weights = SamplingWeights.build(tiny_qwen3().config, tiny_qwen3().state_dict(), None, None, torch.float32)
    expected = min(torch.get_num_threads(), decode_kernel._CPUS)
    with SamplerEngine() as engine:
        engine.submit(weights, None, types.ModelInput.from_ints([5, 17]), 1, types.SamplingParams(max_tokens=3)).result(
            timeout=120
        )
    assert seen and all(matmul == expected for _, matmul in seen)
