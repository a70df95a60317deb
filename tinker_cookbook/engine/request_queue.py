"""The engine's training thread and the queue in front of it.

Training requests of all clients run on one worker thread in submission order, which gives each client the
ordering guarantee of the API (and lets ``forward_backward`` and ``optim_step`` be submitted back to back).

Clients on one base share a pass through it: when the worker starts a built-in-loss ``forward`` or
``forward_backward``, it takes along the queued requests of the same kind of other sessions that are next in their
session's order (nothing of that session queued before them, and no request that belongs to no session, such as
creating a client, queued before them), and runs them together (the backend's ``run_together``). Requests of
different sessions are independent (the base is frozen), so this reorders nothing that any client can observe; a
taken request's future is completed in its own turn in the queue.

Sessions of garbage-collected clients are released through the queue too (``release_collected``). The collector
runs finalizers in whatever thread allocates, which may hold any lock at that moment: this queue's own, or the
module-wide lock of ``concurrent.futures`` that every executor's ``submit`` takes (the server's thread pools too).
Taking a lock there can deadlock, so a finalizer only puts the id into a ``queue.SimpleQueue`` (whose ``put`` is
reentrant and made for finalizers), and a small reaper thread queues the release like any other request.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tinker_cookbook.engine.training.session import ForwardRequest, Outcome
from tinker_cookbook.tinker.errors import InternalServerError, RequestFailedError, TinkerError

T = TypeVar("T")

CLOSED_MESSAGE = (
    "the local engine is closed (LocalBackend.close() was called, or the process is exiting); "
    "create a new ServiceClient to start a new engine"
)


@dataclass(eq=False)
class Queued:
    """A training request in the worker's queue (``RequestQueue``, in submission order)."""

    fn: Callable[[], Any]
    run_id: str | None  # the session whose order it keeps; None: no session's (it keeps everyone's)
    forward: ForwardRequest | None = None  # a built-in-loss forward(_backward), which may run with others
    taken: bool = False  # ran inside another request's batch; its outcome waits for its own turn
    outcome: Outcome | None = None


class RequestQueue:
    """One worker thread running queued requests in order, built-in-loss forwards of several sessions together.

    ``session_count()``: how many sessions exist (the look-ahead stops once it has seen them all);
    ``run_together(requests)``: runs forwards of different sessions in one batch, recording each one's outcome;
    ``release(run_id)``: drops a garbage-collected client's session (on the worker thread).
    """

    def __init__(self, session_count: Callable[[], int], run_together: Callable[[list[Queued]], list[Outcome]],
                 release: Callable[[str], None]) -> None:
        self._session_count = session_count
        self._run_together = run_together
        self._release = release
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-engine")
        self.closed = False
        self._worker_ident: int | None = None
        # Ids of collected clients' sessions (None: stop the reaper); see the module docstring.
        self._collected: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._reaper = threading.Thread(target=self._reap, name="tinker-engine-reaper", daemon=True)
        self._reaper.start()
        # What the worker has yet to start, in submission order (it looks ahead here for requests to batch).
        self._queue: collections.deque[Queued] = collections.deque()
        self._queue_lock = threading.Lock()

    def submit(self, request: Queued) -> concurrent.futures.Future[Any]:
        """Run ``request`` on the worker thread after everything submitted before it."""
        if self.closed:
            raise RequestFailedError(CLOSED_MESSAGE)
        try:
            # One lock over both queues keeps them in the same order.
            with self._queue_lock:
                future = self._executor.submit(self._run_request, request)
                self._queue.append(request)
                return future
        except RuntimeError as exc:  # the executor was shut down meanwhile (close() or interpreter exit)
            raise RequestFailedError(CLOSED_MESSAGE) from exc

    def _run_request(self, request: Queued) -> Any:
        self._worker_ident = threading.get_ident()
        if request.taken:  # it already ran, in an earlier request's batch
            return result(request.outcome)
        partners = self._start(request)
        if self.closed:
            raise RequestFailedError(f"{CLOSED_MESSAGE} (this request was queued but had not started)")
        if request.forward is None or not partners:
            return as_api_error(request.fn)
        return result(self._run_together([request, *partners])[0])

    def _start(self, request: Queued) -> list[Queued]:
        """Take ``request`` off the queue, with the queued requests that can run in one pass with it (none if it
        is not a built-in-loss forward): per session the first one still queued, if it is of the same kind, and
        nothing behind a request of no session. They are marked taken, so that their own turn only reports."""
        with self._queue_lock:
            if self._queue and self._queue[0] is request:
                self._queue.popleft()
            else:  # never expected: the executor runs requests in the order they were queued
                self._queue.remove(request)
            if request.forward is None or self.closed:
                return []
            seen, partners = {request.run_id}, []
            sessions = self._session_count()
            for queued in self._queue:
                if queued.run_id is None or len(seen) >= sessions:  # a barrier, or all sessions seen
                    break
                if queued.run_id in seen:
                    continue
                seen.add(queued.run_id)
                if queued.forward is not None and queued.forward.backward == request.forward.backward:
                    partners.append(queued)
            for partner in partners:
                self._queue.remove(partner)
                partner.taken = True
            return partners

    def release_collected(self, run_id: str) -> None:
        """Note that a client was garbage collected; the reaper queues the release of its session.

        Safe in a finalizer: takes no lock (``SimpleQueue.put`` is reentrant) and never blocks."""
        self._collected.put(run_id)

    def _reap(self) -> None:
        while (run_id := self._collected.get()) is not None:
            try:
                self.submit(Queued(functools.partial(self._release, run_id), run_id))
            except RequestFailedError:  # closed meanwhile: the sessions went with the engine
                return

    def close(self) -> None:
        """Refuse new requests and fail the queued ones; the running one finishes (waited for, except from a
        request running on the worker itself)."""
        self.closed = True
        self._collected.put(None)
        self._executor.shutdown(wait=threading.get_ident() != self._worker_ident)

    def close_at_exit(self) -> None:
        """Mark the queue closed without waiting (Python has joined the worker by the time exit hooks run)."""
        self.closed = True
        self._collected.put(None)
        self._executor.shutdown(wait=False)


def result(outcome: Outcome | None) -> Any:
    """A request's result from its recorded outcome (raising it if it is an exception)."""
    if outcome is None:
        raise InternalServerError("the engine lost the outcome of a batched request (an engine bug)")
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def api_outcome(outcome: Outcome) -> Outcome:
    """An outcome with any exception turned into an API error, as ``as_api_error`` would."""
    if not isinstance(outcome, Exception) or isinstance(outcome, TinkerError):
        return outcome
    error = InternalServerError(f"the engine failed: {type(outcome).__name__}: {outcome}")
    error.__cause__ = outcome
    return error


def as_api_error(fn: Callable[[], T]) -> T:
    """Run ``fn``; API errors pass through, anything else is an engine failure: InternalServerError.

    Only explicit validation raises BadRequestError. A stray ValueError, KeyError or TypeError is a bug in the
    engine, not the user's mistake, so it is never relabelled as one; its type is named and it stays chained as
    ``__cause__`` for the traceback.
    """
    try:
        return fn()
    except TinkerError:
        raise
    except Exception as exc:  # noqa: BLE001 - report any engine failure through the request's future
        raise InternalServerError(f"the engine failed: {type(exc).__name__}: {exc}") from exc
