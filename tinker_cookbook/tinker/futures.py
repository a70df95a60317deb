"""Futures returned by the API.

``APIFuture.result(timeout)`` blocks; ``await future`` / ``await future.result_async()`` waits without blocking
the event loop. Training-side ``*_async`` methods are two-stage, as in the official SDK: the first ``await``
returns once the request is submitted (and so ordered after earlier requests of the same client); awaiting the
returned future gives the result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from tinker_cookbook.tinker.errors import APITimeoutError, RequestFailedError

T = TypeVar("T")
U = TypeVar("U")


def _same(exc: BaseException) -> BaseException:
    return exc


def then(
    future: concurrent.futures.Future[T],
    fn: Callable[[T], U],
    translate: Callable[[BaseException], BaseException] = _same,
) -> concurrent.futures.Future[U]:
    """A future of ``fn(result)``: the one way results are converted on their way to a caller.

    A failure passes through ``translate`` (chained to the original when it is replaced); a cancelled source fails
    with ``RequestFailedError`` instead of leaving the new future pending forever; an exception of ``fn`` belongs
    to the new future.
    """
    out: concurrent.futures.Future[U] = concurrent.futures.Future()

    def copy(src: concurrent.futures.Future[T]) -> None:
        if src.cancelled():
            out.set_exception(RequestFailedError("the request was cancelled"))
            return
        error = src.exception()
        if error is not None:
            translated = translate(error)
            if translated is not error and translated.__cause__ is None:
                translated.__cause__ = error
            out.set_exception(translated)
            return
        try:
            out.set_result(fn(src.result()))
        except BaseException as exc:  # noqa: BLE001 - any failure of fn belongs to the caller's future
            out.set_exception(exc)

    future.add_done_callback(copy)
    return out


class APIFuture(Generic[T]):
    """The pending result of a request."""

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    @classmethod
    def completed(cls, value: T) -> APIFuture[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        future.set_result(value)
        return cls(future)

    @classmethod
    def failed(cls, error: BaseException) -> APIFuture[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_exception(error)
        return cls(future)

    def result(self, timeout: float | None = None) -> T:
        """The result, waiting at most ``timeout`` seconds (None: wait as long as it takes)."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            raise APITimeoutError(f"the request did not finish within timeout={timeout} seconds") from exc

    async def result_async(self, timeout: float | None = None) -> T:
        wrapped = asyncio.wrap_future(self._future)
        try:
            return await asyncio.wait_for(asyncio.shield(wrapped), timeout)
        except TimeoutError as exc:
            raise APITimeoutError(f"the request did not finish within timeout={timeout} seconds") from exc

    def done(self) -> bool:
        return self._future.done()

    def map(self, fn: Callable[[T], U]) -> APIFuture[U]:
        """A future of ``fn(result)``; errors pass through."""
        return APIFuture(then(self._future, fn))

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()

    @property
    def concurrent_future(self) -> concurrent.futures.Future[T]:
        return self._future
