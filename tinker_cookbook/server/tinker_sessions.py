"""What the Tinker protocol server remembers between requests: sessions, the wire ids of training and sampling
clients, and the futures that clients poll. The backend holds everything else (models, adapters, checkpoints).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi.responses import JSONResponse, Response

from tinker_cookbook.tinker import errors, provenance
from tinker_cookbook.tinker.backend import Backend, SamplerHandle

T = TypeVar("T")

MAX_KEPT_RESULTS = 4096
"""Finished futures kept for (re-)retrieval; the oldest finished ones are dropped beyond this."""
BLOCKING_WORKERS = 4
"""Threads for the requests that block (model loads, checkpoint reads), so the event loop keeps serving polls."""
SESSION_TIMEOUT_S = 600.0
"""A session not heard from for this long (the SDK heartbeats every 10 s) is closed and its adapters freed."""
ENDED_SESSIONS_KEPT = 4096
"""Ended session ids remembered, so that finishing a session twice (or after it expired) is not a 404."""
MAX_SAMPLERS_PER_SESSION = 8
"""Sampling sessions a session keeps (each holds sampling weights); the least recently used beyond this are
dropped. A loop that snapshots every step uses one or two at a time."""


class SessionGone(errors.NotFoundError):
    """The session finished or expired: 410, on which the SDK stops heartbeating instead of retrying."""

    status_code = 410


# -- state ------------------------------------------------------------------------------------------------------

@dataclass
class _Session:
    user_metadata: dict[str, str] | None
    model_ids: list[str] = field(default_factory=list)
    sampler_ids: OrderedDict[str, None] = field(default_factory=OrderedDict)  # least recently used first
    last_seen: float = field(default_factory=time.monotonic)
    sampler_counter: itertools.count = field(default_factory=itertools.count)


@dataclass
class _Sampler:
    handle: SamplerHandle
    base_model: str
    model_path: str | None
    session_id: str
    clients: itertools.count = field(default_factory=lambda: itertools.count(1))


@dataclass
class _Pending:
    future: concurrent.futures.Future[Any]
    encode: Callable[[Any], Response]


class State:
    """What the protocol needs to remember between requests; the backend holds everything else."""

    def __init__(self, backend: Backend[Any]) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.sessions: dict[str, _Session] = {}
        self.models: dict[str, str] = {}  # wire model id -> backend run id
        self.model_sessions: dict[str, str] = {}  # wire model id -> session id
        self.samplers: dict[str, _Sampler] = {}
        self.futures: OrderedDict[str, _Pending] = OrderedDict()
        self.sequences = provenance.SequenceRegistry()  # the sampled sequences' ids, for provenance spans
        self.ended: OrderedDict[str, None] = OrderedDict()
        """Sessions that finished or expired, the latest ``ENDED_SESSIONS_KEPT``: finishing one again is no error."""
        self.blocking = concurrent.futures.ThreadPoolExecutor(BLOCKING_WORKERS, thread_name_prefix="tinker-api")

    # -- sessions ------------------------------------------------------------------------------------------
    def open_session(self, user_metadata: dict[str, str] | None) -> str:
        session_id = f"session-{secrets.token_hex(8)}"
        with self.lock:
            self.sessions[session_id] = _Session(user_metadata)
        return session_id

    def session(self, session_id: str) -> _Session:
        with self.lock:
            found = self.sessions.get(session_id)
            if found is not None:
                found.last_seen = time.monotonic()
        if found is None:
            raise SessionGone(f"session_id={session_id!r} is not an open session of this server (it finished, or "
                              f"sent no heartbeat for {SESSION_TIMEOUT_S:.0f} s); create a new ServiceClient")
        return found

    def close_session(self, session_id: str) -> None:
        """Forget the session and free the adapters and optimizer state of its training clients."""
        with self.lock:
            session = self.sessions.pop(session_id, None)
            if session is None:
                return
            self.ended[session_id] = None
            while len(self.ended) > ENDED_SESSIONS_KEPT:
                self.ended.popitem(last=False)
            run_ids = [self.models.pop(m) for m in session.model_ids if m in self.models]
            for model_id in session.model_ids:
                self.model_sessions.pop(model_id, None)
            for sampler_id in session.sampler_ids:
                self.samplers.pop(sampler_id, None)
        for run_id in run_ids:
            self.backend.close_session(run_id)

    def has_ended(self, session_id: str) -> bool:
        """Whether ``session_id`` was a session of this server that has finished or expired (recently)."""
        with self.lock:
            return session_id in self.ended

    def expire_sessions(self) -> None:
        """Close the sessions whose client went away without finishing them (a crash, a lost connection)."""
        now = time.monotonic()
        with self.lock:
            stale = [sid for sid, s in self.sessions.items() if now - s.last_seen > SESSION_TIMEOUT_S]
        for session_id in stale:
            self.close_session(session_id)

    # -- ids -----------------------------------------------------------------------------------------------

    def register_model(self, session_id: str, model_id: str, run_id: str) -> None:
        """Hand out ``model_id`` for the backend's ``run_id``, as a training client of the session."""
        with self.lock:
            session = self.sessions.get(session_id)
            if session is None:  # the session ended while the model was being created: free it again
                self.backend.close_session(run_id)
                raise SessionGone(f"session_id={session_id!r} ended while its training client was being created")
            self.models[model_id] = run_id
            self.model_sessions[model_id] = session_id
            session.model_ids.append(model_id)

    def session_of_model(self, model_id: str) -> str:
        """The session a training client belongs to ("" once the session is gone)."""
        with self.lock:
            return self.model_sessions.get(model_id, "")

    def run_id(self, model_id: str) -> str:
        with self.lock:
            run_id = self.models.get(model_id)
        if run_id is None:
            raise errors.NotFoundError(f"model_id={model_id!r} is not a live training client of this server; create "
                                       "one with create_lora_training_client or create_training_client_from_state")
        return run_id

    def training_run_id(self, run_or_model_id: str) -> str:
        """A run id as the REST routes take it: a run id, or a model id this server handed out."""
        with self.lock:
            return self.models.get(run_or_model_id, run_or_model_id)

    def sampler(self, sampling_session_id: str) -> _Sampler:
        with self.lock:
            found = self.samplers.get(sampling_session_id)
            session = self.sessions.get(found.session_id) if found is not None else None
            if session is not None:
                session.sampler_ids.move_to_end(sampling_session_id)
        if found is None:
            raise errors.NotFoundError(
                f"sampling_session_id={sampling_session_id!r} is not a sampling session of this server (its session "
                f"ended, or it was the least recently used of more than {MAX_SAMPLERS_PER_SESSION}); create a new "
                "sampling client")
        return found

    def add_sampler(self, handle: SamplerHandle, session_id: str) -> str:
        sampler_id = f"sampler-{secrets.token_hex(8)}"
        with self.lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise SessionGone(f"session_id={session_id!r} ended while its sampling client was being created")
            self.samplers[sampler_id] = _Sampler(handle, handle.base_model, handle.model_path, session_id)
            session.sampler_ids[sampler_id] = None
            while len(session.sampler_ids) > MAX_SAMPLERS_PER_SESSION:
                oldest, _ = session.sampler_ids.popitem(last=False)
                self.samplers.pop(oldest, None)
        return sampler_id

    # -- futures -------------------------------------------------------------------------------------------
    def track(self, future: concurrent.futures.Future[Any], encode: Callable[[Any], Response],
              model_id: str | None = None, **extra: Any) -> JSONResponse:
        request_id = f"req-{secrets.token_hex(12)}"
        with self.lock:
            self.futures[request_id] = _Pending(future, encode)
            self._evict()
        return JSONResponse({"request_id": request_id, "model_id": model_id, **extra})

    def _evict(self) -> None:
        excess = len(self.futures) - MAX_KEPT_RESULTS
        if excess <= 0:
            return
        for request_id in [rid for rid, p in self.futures.items() if p.future.done()][:excess]:
            del self.futures[request_id]

    def in_thread(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        return self.blocking.submit(fn)
