"""A Tinker-protocol server on the in-process engine, on a free loopback port, for the official SDK to talk to."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("tinker", reason="the official tinker SDK is not installed (pip install tinker_cookbook[remote])")
fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

API_KEY = "tml-test-key"  # the SDK refuses keys without the tml- prefix; this router does not check keys


def serve(app: object) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread; yield its base URL; stop it afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.01)
    assert server.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


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
