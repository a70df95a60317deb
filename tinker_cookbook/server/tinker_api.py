"""The Tinker wire protocol over HTTP, served by any ``Backend``: what the official ``tinker`` SDK talks to.

``build_router(backend)`` returns the ``/api/v1/...`` routes. The server is a thin adapter: each route parses its
request, calls one backend operation and encodes the answer; all state kept here is the bookkeeping the protocol
itself needs (sessions, the model ids it hands out, sampling sessions, pending futures).

The protocol in brief (as the SDK uses it):

- A client fetches ``client/config`` (feature flags), opens a session (``create_session``) and heartbeats it.
- Work requests (``create_model``, ``forward_backward``, ``optim_step``, ``save_weights``, ``load_weights``,
  ``save_weights_for_sampler``, ``asample``) answer at once with a future ``{"request_id": ...}``; the client
  polls ``retrieve_future``, which waits up to ``RETRIEVE_WAIT_S`` and then answers ``{"type": "try_again"}``,
  so a slow request (a model load, a long batch) never hits an HTTP timeout. A finished future answers its
  result (protobuf for ``ForwardBackwardOutput`` and ``SampleResponse``, JSON otherwise) or
  ``{"error": message, "category": "user"|"server"}``, which the SDK raises as ``RequestFailedError``.
- Direct requests (``get_info``, ``create_sampling_session``, the REST routes under ``training_runs``,
  ``checkpoints``, ``weights_info``) answer at once; their errors are HTTP statuses the SDK maps to its
  exception classes (400 BadRequestError, 404 NotFoundError, 500 InternalServerError).
- ``forward_backward`` bodies are protobuf (``tinker_proto``); every other body is JSON. Unknown fields and
  malformed bodies get 400 with a message naming the field.

Training requests of one model run in the order they arrive, which is the order the SDK sends them in (it sends
a client's requests one after another). A session's training clients live until the client finishes the session
(``sessions/<id>/finish``, sent when a ServiceClient closes) or stops heartbeating for ``SESSION_TIMEOUT_S``.

The routes live in ``tinker_routes``, one module per group (``service``, ``training``, ``sampling``, ``futures``,
``checkpoints``); this module sets the protocol's limits and mounts them.

Not handled here (the app that mounts this router does it): authentication (the SDK sends its key, which must start
with ``tml-``, in the ``X-API-Key`` header) and request size limits (protobuf ``forward_backward`` bodies reach
several MB: the SDK splits batches at about 5 MB).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tinker_cookbook.server.guards import register_store_root
from tinker_cookbook.server.tinker_routes import checkpoints, futures, sampling, service, training
from tinker_cookbook.server.tinker_routes.common import PROTOBUF, Routes
from tinker_cookbook.server.tinker_sessions import State
from tinker_cookbook.tinker.backend import Backend

__all__ = ["MAX_NUM_SAMPLES", "PROTOBUF", "RETRIEVE_WAIT_S", "build_router"]

RETRIEVE_WAIT_S = 35.0
"""How long ``retrieve_future`` holds a poll open before answering try_again: below the SDK's 45 s per poll, and
long, because the SDK logs a warning for every try_again."""
MAX_NUM_SAMPLES = 128
"""The most samples one ``asample`` request may ask for."""


def build_router(backend: Backend[Any]) -> APIRouter:
    """All Tinker-protocol routes, served by ``backend`` (the limits above are read now)."""
    register_store_root(getattr(getattr(backend, "store", None), "root", None))  # never named in answers
    routes = Routes(backend, State(backend), APIRouter(prefix="/api/v1"))
    service.add_routes(routes)
    training.add_routes(routes)
    sampling.add_routes(routes, MAX_NUM_SAMPLES)
    futures.add_routes(routes, RETRIEVE_WAIT_S)
    checkpoints.add_routes(routes)
    return routes.router
