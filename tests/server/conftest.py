"""A Tinker-protocol server on the in-process engine, on a free loopback port, for the official SDK to talk to."""

from __future__ import annotations

import concurrent.futures
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("tinker", reason="the official tinker SDK is not installed (pip install 'tinker==0.38.0')")
fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_utils import serve  # noqa: E402 - after the skips, which need no uvicorn

API_KEY = "tml-test-key"  # the SDK refuses keys without the tml- prefix; this router does not check keys


@pytest.fixture(scope="package")
def server_backend() -> Any:
    from tinker_cookbook.backends import local_backend

    return local_backend()


@pytest.fixture(scope="package")
def server_url(server_backend: Any) -> Iterator[str]:
    from tinker_cookbook.server.tinker_api import build_router

    app = fastapi.FastAPI()
    app.include_router(build_router(server_backend))
    yield from serve(app)


@pytest.fixture(autouse=True)
def _server_answers(request: pytest.FixtureRequest) -> None:
    """Before a test of the shared server: it still answers, and its engine still runs requests. The SDK retries a
    refused connection or a 5xx for up to two hours, so without this a dead server thread or a stuck engine from an
    earlier test would show up as every later test hanging, with nothing naming the cause."""
    if "server_url" not in request.fixturenames:
        return
    url = request.getfixturevalue("server_url")
    try:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
        with direct.open(f"{url}/api/v1/healthz", timeout=30) as answer:
            assert answer.status == 200
    except OSError as exc:
        pytest.fail(f"the shared test server at {url} does not answer /api/v1/healthz ({exc!r}): an earlier test "
                    "stopped it or its event loop is blocked")
    try:
        request.getfixturevalue("server_backend").submit(lambda: None).result(timeout=300)
    except concurrent.futures.TimeoutError:
        pytest.fail("the shared test server's engine ran no request for 300 s: an earlier request is stuck")


@pytest.fixture(autouse=True)
def _sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK would report client telemetry to the server and read ~/.tinker credentials; keep tests hermetic.
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
