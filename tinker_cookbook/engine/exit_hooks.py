"""Objects the engine must close while the interpreter is still whole (worker threads running torch code)."""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class CloseAtExit(Generic[T]):
    """A weak set of live objects, each closed by ``close`` at interpreter exit.

    The atexit hook is registered at the first ``add``: hooks run last-registered first, so an engine part started
    later (the sampler) is closed before one started earlier (the backend).
    """

    def __init__(self, close: Callable[[T], None]) -> None:
        self._close = close
        self._objects: weakref.WeakSet[T] = weakref.WeakSet()  # type: ignore[type-var]
        self._lock = threading.Lock()
        self._registered = False

    def add(self, obj: T) -> None:
        with self._lock:
            if not self._registered:
                atexit.register(self._close_all)
                self._registered = True
            self._objects.add(obj)

    def discard(self, obj: T) -> None:
        self._objects.discard(obj)

    def _close_all(self) -> None:
        for obj in list(self._objects):
            self._close(obj)
