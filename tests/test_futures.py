"""``then``: the one way a result is converted on its way to the caller (APIFuture.map, the server, the SDK)."""

from __future__ import annotations

import concurrent.futures

import pytest

from tinker_cookbook.tinker import errors
from tinker_cookbook.tinker.futures import APIFuture, then


def test_then_converts_the_result() -> None:
    source: concurrent.futures.Future[int] = concurrent.futures.Future()
    out = then(source, lambda x: x * 2)
    source.set_result(21)
    assert out.result(timeout=5) == 42


def test_then_passes_failures_through_translated_and_chained() -> None:
    source: concurrent.futures.Future[int] = concurrent.futures.Future()
    out = then(source, lambda x: x, lambda exc: errors.NotFoundError(f"gone: {exc}"))
    original = KeyError("k")
    source.set_exception(original)
    with pytest.raises(errors.NotFoundError, match="gone") as info:
        out.result(timeout=5)
    assert info.value.__cause__ is original


def test_a_failing_conversion_belongs_to_the_new_future() -> None:
    source: concurrent.futures.Future[int] = concurrent.futures.Future()
    out = then(source, lambda x: 1 // x)
    source.set_result(0)
    with pytest.raises(ZeroDivisionError):
        out.result(timeout=5)


def test_a_cancelled_source_fails_the_mapped_future_instead_of_leaving_it_pending() -> None:
    # Before: the callback raised CancelledError inside add_done_callback (logged and swallowed), so the mapped
    # future never completed and a caller waiting on it without a timeout hung forever.
    source: concurrent.futures.Future[int] = concurrent.futures.Future()
    mapped = APIFuture(source).map(lambda x: x + 1)
    assert source.cancel()
    with pytest.raises(errors.RequestFailedError, match="cancelled"):
        mapped.result(timeout=5)
