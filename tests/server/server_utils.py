"""Running an ASGI app on a free loopback port for the duration of a test; checking what answers show."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn


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


def private_paths() -> list[str]:
    """What no answer of the server may contain: the store's folder, the home folder, the cache under it and the
    working folder."""
    from tinker_cookbook.backends import local_backend

    store = str(local_backend().store.root)
    return [store, str(Path(store).resolve()), str(Path.home()), "~/.cache", os.getcwd()]


def assert_public(response: httpx.Response) -> None:
    """The answer shows no path of the machine and no traceback."""
    text = response.text
    leaked = [p for p in private_paths() if p in text]
    assert not leaked, f"the answer shows {leaked}: {text}"
    assert "Traceback" not in text and 'File "' not in text, text
