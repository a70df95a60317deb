"""Every engine test runs once per device: the CPU, and CUDA where torch sees a GPU (CI: CPU only)."""

from collections.abc import Iterator

import pytest
import torch

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(params=DEVICES, autouse=True, scope="module")
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The engine device of this test: ``$TINKER_COOKBOOK_DEVICE`` while it runs (``LocalBackend.default()`` and
    the sampler's default dtype follow it). Module-scoped, so pytest runs a module's tests per device in turn."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_COOKBOOK_DEVICE", request.param)
        yield request.param
