"""The HTTP app: the OpenAI-compatible and Tinker routes behind one API-key check, body limit and error format.

``create_app(backend, api_key=..., host=...)`` builds the FastAPI app; ``tinker_cookbook.server.running`` serves
it with uvicorn (the ``tinker-cookbook serve`` command). Security defaults:

- Loopback only unless an API key is set: ``create_app`` refuses any other bind address without a key, so the
  engine (which can read and write the local checkpoint store) is never open to the network by accident.
- With a key, every request needs it, as ``Authorization: Bearer KEY`` (OpenAI clients) or ``X-API-Key: KEY``
  (the official ``tinker`` SDK); it is compared in constant time.
- A request body larger than ``ServerLimits.max_body_bytes`` gets 413 before any of it is parsed.
- Browsers cannot drive it (``guards``): a loopback server answers only loopback ``Host`` names (DNS rebinding),
  cross-site ``Origin`` headers get 403 and bodies that are not JSON 415; ``allowed_hosts`` / ``allowed_origins``
  widen the first two.
- Every error is a JSON body ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's format) with a 4xx
  status for bad input and 5xx only for engine failures; no request can stop the server. Messages never carry
  a traceback or a path of this machine (``guards.public_text``); a bug answers 500 with its class only.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tinker_cookbook.base.hosts import is_loopback
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.server.guards import (
    AddressCheck,
    ContentTypeCheck,
    cors_settings,
    internal_error_text,
    public_text,
    register_store_root,
)
from tinker_cookbook.tinker import errors
from tinker_cookbook.tinker.backend import Backend

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MIN_API_KEY_LENGTH = 16
"""Shorter keys are refused: a key guards an engine that reads and writes the checkpoint store."""


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for; a request beyond a limit gets a 4xx that names the limit."""

    max_body_bytes: int = 8 * 1024 * 1024
    """Request bodies above this get 413 (8 MiB holds a prompt far beyond any supported context window)."""
    max_n: int = 16
    """``n`` (samples per prompt) of one request."""
    max_samples_per_request: int = 64
    """Prompts x ``n`` of one request: all of a request's samples join the shared batch together."""
    max_stop_sequences: int = 16
    """User ``stop`` strings of one request (OpenAI allows 4)."""


# ---------------------------------------------------------------------------------------------------------
# Bind address and key
# ---------------------------------------------------------------------------------------------------------


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse a non-loopback bind without an API key, and keys too short to guard anything."""
    if api_key is not None and len(api_key) < MIN_API_KEY_LENGTH:
        raise ConfigurationError(
            f"the API key has {len(api_key)} characters; use at least {MIN_API_KEY_LENGTH} "
            "(`tinker-cookbook serve --generate-api-key` makes a random one)"
        )
    if not api_key and not is_loopback(host):
        raise ConfigurationError(
            f"host={host!r} is not a loopback address, and serving the engine beyond this machine needs an API "
            "key: pass --api-key KEY (or set TINKER_COOKBOOK_API_KEY, or use --generate-api-key), or bind "
            "127.0.0.1"
        )


def _presented_keys(scope: Scope) -> list[bytes]:
    keys = []
    for name, value in scope.get("headers", []):
        if name == b"x-api-key":
            keys.append(value.strip())
        elif name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                keys.append(token.strip())
    return keys


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
                415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error"}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error format, which OpenAI clients turn into their exception's message."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": public_text(message), "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


async def _send_error(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    """An error response from ASGI middleware (before any route runs)."""
    body = json.dumps(error_body(status, message)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def status_of(exc: errors.TinkerError) -> int:
    """The HTTP status of an API error: its class's ``status_code``; a failed engine request is 500."""
    return int(getattr(exc, "status_code", 500))


def describe_validation_errors(problems: list[Any]) -> tuple[str, str | None]:
    """One message for pydantic/FastAPI validation errors (each names its field), and the first field."""
    parts, first = [], None
    for problem in problems:
        loc = [str(p) for p in problem.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "body"
        first = first or field
        kind = problem.get("type", "")
        if kind == "extra_forbidden":
            parts.append(f"{field}: unknown field; remove it")
        elif kind in ("json_invalid", "json_type"):
            parts.append(f"the body is not valid JSON: {problem.get('ctx', {}).get('error', problem.get('msg'))}")
        elif kind == "missing":
            parts.append(f"{field}: required field missing")
        else:
            parts.append(f"{field}: {problem.get('msg', 'invalid')} (got {problem.get('input')!r:.80})")
    return "; ".join(parts) or "invalid request body", first


# ---------------------------------------------------------------------------------------------------------
# Middleware (plain ASGI, so that a refused request never reaches routing or body parsing)
# ---------------------------------------------------------------------------------------------------------


class _APIKeyCheck:
    """Every HTTP request must carry the key (``Authorization: Bearer`` or ``X-API-Key``); else 401."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        presented = _presented_keys(scope)
        # compare_digest takes time independent of where the strings differ, so timing leaks nothing about the key
        if any(hmac.compare_digest(key, self.key) for key in presented):
            return await self.app(scope, receive, send)
        message = ("invalid API key" if presented else
                   "missing API key: send it as 'Authorization: Bearer KEY' or as 'X-API-Key: KEY'")
        await _send_error(send, 401, message, {"WWW-Authenticate": "Bearer"})


class _BodyLimit:
    """Reads the body up to ``max_bytes`` (413 beyond, whatever Content-Length claims), then replays it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = (f"the request body is larger than the server's limit of {self.max_bytes} bytes; send a "
                     "smaller request (or start the server with a larger --max-body-bytes)")
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await _send_error(send, 400, f"Content-Length {declared.decode(errors='replace')!r} is not "
                                                    "a number of bytes")
            if int(declared) > self.max_bytes:
                return await _send_error(send, 413, too_large)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await _send_error(send, 413, too_large)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the client's disconnect, as streaming responses expect

        await self.app(scope, replay, send)


# ---------------------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------------------


def create_app(backend: Backend[Any], *, api_key: str | None = None, host: str = "127.0.0.1",
               limits: ServerLimits | None = None, preload: Sequence[str] = (),
               allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = ()) -> FastAPI:
    """The server's app for ``backend``; raises ConfigurationError for a non-loopback ``host`` without a key.

    ``host`` is the address the app will be served on: it decides whether a key is required and whether only
    loopback ``Host`` names are answered. ``preload``: models (base names or ``tinker://`` paths) to load now
    rather than on their first request. ``allowed_hosts``: other names the server answers to (e.g. behind a
    proxy); ``allowed_origins``: web origins (``https://app.example``) whose pages may call it; ``"*"``: any.
    """
    from tinker_cookbook.server import openai_api, openai_models, tinker_api

    check_bind(host, api_key)
    register_store_root(getattr(getattr(backend, "store", None), "root", None))
    limits = limits or ServerLimits()
    app = FastAPI(title="tinker-cookbook", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.limits = limits
    app.state.backend = backend
    app.state.models = openai_models.ModelRegistry(backend)
    for name in preload:
        app.state.models.preload(name)
    app.include_router(openai_api.build_router(backend, limits, app.state.models))
    app.include_router(tinker_api.build_router(backend))
    _add_error_handlers(app)
    # Outermost first when serving: Host and Origin, CORS (a browser's preflight carries no key), the key check,
    # the Content-Type check, the body limit, then routing.
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(ContentTypeCheck, send_error=_send_error)
    if api_key:
        app.add_middleware(_APIKeyCheck, api_key=api_key)
    app.add_middleware(CORSMiddleware, **cors_settings(allowed_origins))
    app.add_middleware(AddressCheck, send_error=_send_error, bind_host=host, allowed_hosts=allowed_hosts,
                       allowed_origins=allowed_origins)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; the OpenAI routes are under /v1"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = describe_validation_errors(list(exc.errors()))
        return error_response(400, message, param)

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, errors.TinkerError)
        status = status_of(exc)
        if status >= 500:
            logger.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(status, str(exc))

    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: 500 naming the class only (its message may hold paths); the server keeps serving.
        logger.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, internal_error_text(exc))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(errors.TinkerError, api_error)
    app.add_exception_handler(Exception, unexpected_error)
