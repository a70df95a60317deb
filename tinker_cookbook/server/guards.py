"""What a request must show before any route reads it, and what an answer may show of this machine.

Browsers (``AddressCheck``, ``ContentTypeCheck``): a web page the user visits can send requests to a server on the user's own
machine, and a server without a key would obey them. Three checks stop that without touching other clients (SDKs,
``curl``, the OpenAI client), which send no ``Origin`` and always send JSON:

- ``Host``, against DNS rebinding (a site whose name resolves to 127.0.0.1 is then "same-origin" with this server):
  a server bound to loopback answers only requests addressed to a loopback name (``localhost``, ``127.0.0.1``,
  ``[::1]``) or to a name in ``allowed_hosts``; 400 otherwise.
- ``Origin``, sent by browsers with every cross-site request: only pages on a loopback host, the server's own
  origin or an origin in ``allowed_origins`` may call; 403 otherwise (also for the opaque origin ``null``).
- ``Content-Type``: a body must be JSON (``forward_backward`` also takes protobuf); 415 otherwise. HTML forms and
  ``fetch`` without a CORS preflight can only send text, form or multipart bodies.

Pages that pass the ``Origin`` check get CORS headers (``cors_settings``), so that a browser lets them read the
answers and send JSON. ``"*"`` in ``allowed_hosts`` / ``allowed_origins`` turns that check off. ``tinker-cookbook serve --allow-host`` and
``--allow-origin`` set them (docs/serving.md).

Machine paths (``public_text``): error messages of the engine name files of the checkpoint store, the model cache
or the home directory, which help a local user but tell a remote one about the machine; every error the server
sends goes through ``public_text``, which replaces them (the store's root becomes ``<store>``, other paths
``<path>``).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tinker_cookbook.base.hosts import is_loopback

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorSender = Callable[[Send, int, str], Awaitable[None]]

ANY = "*"
PROTOBUF_PATHS = ("/api/v1/forward_backward",)
"""Routes whose body is protobuf (``application/x-protobuf``); every other body is JSON."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# ---------------------------------------------------------------------------------------------------------
# Headers
# ---------------------------------------------------------------------------------------------------------


def host_name(authority: str) -> str:
    """The host of a ``Host`` header or URL authority, without port and brackets, lower case."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def _headers(scope: Scope) -> dict[bytes, str]:
    return {name: value.decode("latin-1") for name, value in scope.get("headers", [])}


class AddressCheck:
    """The ``Host`` and ``Origin`` checks above, before anything else (plain ASGI middleware)."""

    def __init__(self, app: ASGIApp, *, send_error: ErrorSender, bind_host: str,
                 allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.send_error = send_error
        self.allowed_hosts = {host_name(h) for h in allowed_hosts}
        # A public bind is reachable by other names anyway; it is guarded by its key, so only a configured list
        # of names is enforced there.
        self.check_host = ANY not in self.allowed_hosts and (is_loopback(bind_host) or bool(self.allowed_hosts))
        self.allowed_origins = {o.strip().rstrip("/").lower() for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        problem = self._host_problem(headers.get(b"host")) or self._origin_problem(headers)
        if problem is not None:
            return await self.send_error(send, *problem)
        await self.app(scope, receive, send)

    def _host_allowed(self, name: str) -> bool:
        return is_loopback(name) or name in self.allowed_hosts or ANY in self.allowed_hosts

    def _host_problem(self, host: str | None) -> tuple[int, str] | None:
        if not self.check_host or host is None:  # no Host: HTTP/1.0, never a browser
            return None
        name = host_name(host)
        if self._host_allowed(name):
            return None
        return 400, (f"Host {host!r} is not a name of this server: it is bound to loopback and answers only "
                     "requests addressed to localhost, 127.0.0.1 or [::1] (a guard against DNS rebinding); start "
                     f"it with --allow-host {name} to serve that name too")

    def _origin_problem(self, headers: dict[bytes, str]) -> tuple[int, str] | None:
        origin = headers.get(b"origin")
        if origin is None or ANY in self.allowed_origins:
            return None
        normalized = origin.strip().rstrip("/").lower()
        if normalized in self.allowed_origins:
            return None
        try:
            parts = urlsplit(normalized)
            origin_host = parts.hostname or ""
        except ValueError:
            origin_host = ""
        own_host = host_name(headers.get(b"host", ""))
        if origin_host and (is_loopback(origin_host) or (origin_host == own_host and self._host_allowed(own_host))):
            return None
        return 403, (f"Origin {origin!r} may not call this server: browsers send the Origin of the page making a "
                     "request, and only pages on this machine (localhost) may call it; start the server with "
                     f"--allow-origin {origin} to allow that site")


class ContentTypeCheck:
    """The ``Content-Type`` check above (after the key check: a client without the key learns only that)."""

    def __init__(self, app: ASGIApp, *, send_error: ErrorSender) -> None:
        self.app = app
        self.send_error = send_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = _content_problem(scope, _headers(scope))
            if problem is not None:
                return await self.send_error(send, *problem)
        await self.app(scope, receive, send)


def _content_problem(scope: Scope, headers: dict[bytes, str]) -> tuple[int, str] | None:
    if scope.get("method") not in _BODY_METHODS:
        return None
    content_type = headers.get(b"content-type")
    if content_type is None:
        has_body = headers.get(b"content-length", "0").strip() != "0" or b"transfer-encoding" in headers
        if not has_body:
            return None
        media_type = ""
    else:
        media_type = content_type.split(";", 1)[0].strip().lower()
    if _is_json(media_type):
        return None
    path = scope.get("path", "")
    if media_type == "application/x-protobuf" and path in PROTOBUF_PATHS:
        return None
    expected = "application/json" + (" or application/x-protobuf" if path in PROTOBUF_PATHS else "")
    return 415, (f"{path} takes an {expected} body, but the request's Content-Type is "
                 f"{content_type or 'missing'}; send the body as JSON with 'Content-Type: application/json'")


LOOPBACK_ORIGIN = r"https?://(localhost|127\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[::1\])(:\d+)?"


def cors_settings(allowed_origins: Sequence[str]) -> dict[str, Any]:
    """Starlette ``CORSMiddleware`` settings for the origins ``AddressCheck`` lets through: loopback pages
    and the allowed origins. No cookies are involved (keys travel in headers), so no credentials mode."""
    listed = [o.strip().rstrip("/") for o in allowed_origins]
    return {"allow_origins": ["*"] if ANY in listed else listed, "allow_origin_regex": LOOPBACK_ORIGIN,
            "allow_methods": ["*"], "allow_headers": ["*"], "allow_credentials": False}


# ---------------------------------------------------------------------------------------------------------
# Machine paths in answers
# ---------------------------------------------------------------------------------------------------------

_STORE_PLACEHOLDER = "<store>"
_PATH_PLACEHOLDER = "<path>"
_PATH_TAIL = r"[^\s'\"`),;]*"
_store_roots: set[str] = set()


def register_store_root(root: Any) -> None:
    """Name a checkpoint store's root as private (a server calls this for its backend's store)."""
    if root is None:
        return
    for form in {str(root), str(Path(root).expanduser().resolve())}:
        if len(form) > 1:
            _store_roots.add(form)


def _private_roots() -> list[str]:
    """Folders of this machine that answers never name: home, interpreter, working and temporary folders."""
    roots = {str(Path.home()), sys.prefix, sys.base_prefix, os.getcwd(), tempfile.gettempdir()}
    roots |= {str(Path(r).resolve()) for r in list(roots)}
    return sorted((r for r in roots if len(r) > 1), key=len, reverse=True)


def public_text(text: str) -> str:
    """``text`` with this machine's paths replaced: the store's root by ``<store>`` (the rest of a store path
    stays: it names runs and checkpoints the client knows), other private folders' paths and ``~/...`` by
    ``<path>``."""
    for root in sorted(_store_roots, key=len, reverse=True):
        text = text.replace(root, _STORE_PLACEHOLDER)
    for root in _private_roots():
        text = re.sub(re.escape(root) + r"(?:/" + _PATH_TAIL + r")?", _PATH_PLACEHOLDER, text)
    return re.sub(r"~/" + _PATH_TAIL, _PATH_PLACEHOLDER, text)


def internal_error_text(exc: BaseException) -> str:
    """What a client learns of a failure that is a bug, not its input: the class only (the server logs the rest)."""
    return f"internal server error ({type(exc).__name__}); the server's log has the details"

