"""A Tinker-protocol server on the in-process engine, on a free loopback port, for the official SDK to talk to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("tinker", reason="the official tinker SDK is not installed (pip install tinker_cookbook[remote])")
fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_utils import serve  # noqa: E402 - after the skips, which need no uvicorn

API_KEY = "tml-test-key"  # the SDK refuses keys without the tml- prefix; this router does not check keys


@pytest.fixture(scope="package")
def server_url() -> Iterator[str]:
    from tinker_cookbook.backends import local_backend
    from tinker_cookbook.server.tinker_api import build_router

    app = fastapi.FastAPI()
    app.include_router(build_router(local_backend()))
    yield from serve(app)


@pytest.fixture(autouse=True)
def _sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK would report client telemetry to the server and read ~/.tinker credentials; keep tests hermetic.
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
