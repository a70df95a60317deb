"""The sampler's one-thread decode steps change only its own worker thread's torch thread count."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tinker_cookbook.engine import threads
from tinker_cookbook.engine.sampling import decode as sampler_decode
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.engine.threads import LocalThreads
from tinker_cookbook.tinker import types

PROCESS_THREADS = 2
"""The process-wide count under test: more than one, so that a leaked count of one shows."""


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The process default set to ``PROCESS_THREADS`` (whatever $OMP_NUM_THREADS says), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(PROCESS_THREADS)
    yield
    torch.set_num_threads(before)


def _count_on_new_thread() -> int:
    """``torch.get_num_threads()`` as seen by a thread started now (ATen initialises its count on first use)."""
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def _on_thread(work: Callable[[], Any]) -> Any:
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def test_local_threads_sets_only_the_calling_thread(two_threads: None) -> None:
    def work() -> dict[str, int]:
        local = LocalThreads()
        if not local.active:
            pytest.skip("this torch build's OpenMP runtime does not take per-thread counts")
        local.set(1)
        seen = {"own": torch.get_num_threads(), "new": _count_on_new_thread()}
        local.set(PROCESS_THREADS)
        seen["own_after"] = torch.get_num_threads()
        return seen

    seen = _on_thread(work)
    assert seen == {"own": 1, "new": PROCESS_THREADS, "own_after": PROCESS_THREADS}
    assert torch.get_num_threads() == PROCESS_THREADS
    assert _count_on_new_thread() == PROCESS_THREADS


def test_local_threads_refuses_other_threads(two_threads: None) -> None:
    local = _on_thread(LocalThreads)
    if not local.active:
        pytest.skip("this torch build's OpenMP runtime does not take per-thread counts")
    with pytest.raises(RuntimeError, match="other than the one that created it"):
        local.set(1)


def test_local_threads_without_an_openmp_runtime_change_nothing(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no OpenMP runtime is found among the loaded libraries, ``set`` is a no-op (the worker keeps the
    process count) rather than an error."""
    monkeypatch.setattr(threads, "_runtime_cache", [])
    monkeypatch.setattr(threads, "_loaded_libraries", lambda: [])

    def work() -> tuple[bool, int]:
        local = LocalThreads()
        local.set(1)
        return local.active, torch.get_num_threads()

    assert _on_thread(work) == (False, PROCESS_THREADS)


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def test_decode_steps_keep_other_threads_counts(
    two_threads: None, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While and after the sampler decodes one sequence (one-thread steps), the main thread, a thread started
    during a decode step and one started afterwards all keep the process count. With ``torch.set_num_threads(1)``
    on the worker instead, the thread started during the step would get one thread (ATen's process-wide value)."""
    model = _tiny_llama()
    state = {k: v.to(device) for k, v in model.state_dict().items()}
    weights = SamplingWeights.build(model.config, state, None, None, torch.float32)
    during: list[dict[str, int]] = []
    decode = sampler_decode.decode

    def spying_decode(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(during) < 3:
            during.append({"worker": torch.get_num_threads(), "new": _count_on_new_thread()})
        return decode(*args, **kwargs)

    monkeypatch.setattr(sampler_decode, "decode", spying_decode)
    with SamplerEngine() as engine:
        params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
        response = engine.submit(weights, None, types.ModelInput.from_ints([1, 2, 3, 4]), 1, params).result(60)
    assert len(response.sequences[0].tokens) == 8
    assert len(during) == 3
    assert all(seen["new"] == PROCESS_THREADS for seen in during), during
    if device == "cpu" and _on_thread(lambda: LocalThreads().active):
        # The worker itself did decode on one thread: the check above is not vacuous.
        assert all(seen["worker"] == 1 for seen in during), during
    assert torch.get_num_threads() == PROCESS_THREADS
    assert _count_on_new_thread() == PROCESS_THREADS
