"""Serving the app with uvicorn: in the foreground (``tinker-cookbook serve``) or on a thread (tests, benchmarks)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI

from tinker_cookbook.base.hosts import is_loopback
from tinker_cookbook.server.app import ServerLimits, create_app
from tinker_cookbook.tinker.backend import Backend

DEFAULT_MAX_CONNECTIONS = 256
"""Open connections beyond this get 503 from uvicorn instead of piling up in memory."""


def generate_api_key() -> str:
    """A random key with the ``tml-`` prefix that the official ``tinker`` SDK requires of keys."""
    return "tml-" + secrets.token_urlsafe(32)


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_started(port)`` once the socket is bound (the real port when port=0)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[int], None] | None = None) -> None:
        super().__init__(config)
        self.on_started = on_started
        self.port: int | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            self.port = int(self.servers[0].sockets[0].getsockname()[1])
            if self.on_started is not None:
                self.on_started(self.port)


def _config(app: FastAPI, host: str, port: int, *, access_log: bool, log_level: str,
            max_connections: int) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, access_log=access_log, log_level=log_level, lifespan="off",
                          limit_concurrency=max_connections, timeout_graceful_shutdown=5)


def banner(host: str, port: int, models: Sequence[str], loaded: Sequence[str], api_key: str | None,
           key_generated: bool) -> str:
    """What ``serve`` prints once listening: the URLs, the models and whether a key is needed."""
    if host in ("0.0.0.0", "::"):
        url = f"http://<this machine's address>:{port}"  # bound on every interface
    else:
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    where = "loopback: this machine only" if is_loopback(host) else "reachable from other machines"
    lines = [f"tinker-cookbook server listening on {url} ({where})",
             f"  OpenAI API:  {url}/v1   e.g. OpenAI(base_url=\"{url}/v1\", api_key=...)",
             f"  Tinker API:  {url}",
             "  Models:      " + (", ".join(f"{m} (loaded)" if m in loaded else m for m in models) or "none"),
             "               and any tinker://RUN/sampler_weights/NAME checkpoint in the local store"]
    if api_key is None:
        lines.append("  API key:     none needed (loopback only); pass --api-key to require one")
    elif key_generated:
        lines.append(f"  API key:     {api_key}  (generated; send it as 'Authorization: Bearer KEY' or 'X-API-Key')")
    else:
        lines.append("  API key:     required ('Authorization: Bearer KEY' or 'X-API-Key: KEY')")
        if not api_key.startswith("tml-"):
            lines.append("               note: the official tinker SDK only sends keys that start with 'tml-'")
    return "\n".join(lines)


def serve(backend: Backend[Any], *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          key_generated: bool = False, limits: ServerLimits | None = None, preload: Sequence[str] = (),
          access_log: bool = False, max_connections: int = DEFAULT_MAX_CONNECTIONS,
          announce: Callable[[str], None] | None = None, allowed_hosts: Sequence[str] = (),
          allowed_origins: Sequence[str] = ()) -> None:
    """Serve ``backend`` until interrupted (Ctrl-C); raises ConfigurationError for an unsafe bind.

    Once listening it prints (or passes to ``announce``) the banner: URLs, models and whether a key is needed.
    ``allowed_hosts`` / ``allowed_origins``: see ``create_app``.
    """
    app = create_app(backend, api_key=api_key, host=host, limits=limits, preload=preload,
                     allowed_hosts=allowed_hosts, allowed_origins=allowed_origins)
    models = app.state.models.base_model_names()
    loaded = list(preload)

    def started(bound_port: int) -> None:
        text = banner(host, bound_port, models, loaded, api_key, key_generated)
        if announce is None:
            print(text, flush=True)  # flushed: a supervising process reads the URL from a pipe
        else:
            announce(text)

    config = _config(app, host, port, access_log=access_log, log_level="info" if access_log else "warning",
                     max_connections=max_connections)
    _Server(config, started).run()


class BackgroundServer:
    """``app`` served by uvicorn on a daemon thread, for tests and benchmarks::

        with BackgroundServer(app) as server:   # 127.0.0.1 and a free port
            OpenAI(base_url=server.url + "/v1", api_key="-")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 60.0) -> None:
        self.host = host
        self._ready = threading.Event()
        config = _config(app, host, port, access_log=False, log_level="warning",
                         max_connections=DEFAULT_MAX_CONNECTIONS)
        self._server = _Server(config, lambda _port: self._ready.set())
        self._thread = threading.Thread(target=self._run, name="tinker-cookbook-server", daemon=True)
        self._start_timeout = start_timeout

    def _run(self) -> None:
        try:
            self._server.run()
        finally:
            self._ready.set()  # also when it could not start (uvicorn logs why)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._server.port}"

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        if not self._ready.wait(self._start_timeout) or self._server.port is None:
            self._server.should_exit = True
            raise RuntimeError(f"the server did not start on {self.host} (see the log above)")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
