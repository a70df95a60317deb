"""Every engine test runs once per device: the CPU, and CUDA where torch sees a GPU (CI: CPU only)."""

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from sampler_models import sampling_weights, tiny_qwen3
from transformers import AutoTokenizer, Qwen3ForCausalLM

from tinker_cookbook.base import assets
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(params=DEVICES, autouse=True, scope="module")
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The engine device of this test: ``$TINKER_COOKBOOK_DEVICE`` while it runs (``LocalBackend.default()`` and
    the sampler's default dtype follow it). Module-scoped, so pytest runs a module's tests per device in turn."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_COOKBOOK_DEVICE", request.param)
        yield request.param


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The real Qwen3 tokenizer (a module may define its own ``tokenizer``, which then takes precedence)."""
    return AutoTokenizer.from_pretrained(assets.require(assets.qwen3_tokenizer_dir(), "the Qwen3 tokenizer"))


@pytest.fixture(scope="module")
def engine() -> Iterator[SamplerEngine]:
    """One sampler engine shared by a module's tests."""
    with SamplerEngine(max_batch_sequences=64) as shared:
        yield shared


@pytest.fixture(scope="module")
def qwen3() -> Qwen3ForCausalLM:
    """The tiny random Qwen3 of ``sampler_models.tiny_qwen3`` that the sampler's tests compare with."""
    return tiny_qwen3()


@pytest.fixture(scope="module")
def qwen3_weights(qwen3: Qwen3ForCausalLM, device: str) -> SamplingWeights:
    """``qwen3``'s fp32 sampling weights on the module's device."""
    return sampling_weights(qwen3, device=device)


@pytest.fixture
def group_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that receives each training group's padded size (rows x longest row), in the order the engine runs
    them (a spy on ``forward.run_group``, for this test only)."""
    from tinker_cookbook.engine.training import forward

    sizes: list[int] = []
    original = forward.run_group

    def spy(base: Any, model: Any, items: list[Any], *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(items) * max(len(item.input_ids) for item in items))
        return original(base, model, items, *args, **kwargs)

    monkeypatch.setattr(forward, "run_group", spy)
    return sizes
