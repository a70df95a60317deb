"""Errors of the Tinker-compatible API (the same names as the official SDK).

Bad input raises ``BadRequestError`` (also a ``ValueError``); the message names the field, the bad value and
the fix. Only such explicit validation raises it: a failure inside the engine is ``InternalServerError`` with the
original exception as ``__cause__``. A request that fails never leaves half-done state behind: the next valid
request succeeds.
"""

from __future__ import annotations


class TinkerError(Exception):
    """Base class of every error raised through ``tinker_cookbook.tinker``."""


class APIError(TinkerError):
    """A request was rejected or failed."""


class BadRequestError(APIError, ValueError):
    """The request is malformed: a bad field value, a missing input, an unknown name."""


class UnprocessableEntityError(BadRequestError):
    """The request is well-formed but cannot be processed: an image for a text model, or a loss, gradient or
    update that overflows to NaN/inf (refused so that it never reaches the weights)."""


class NotFoundError(APIError, LookupError):
    """A model, run or checkpoint does not exist."""


class ConflictError(APIError):
    """The request conflicts with existing state (e.g. a checkpoint name already in use)."""


class RequestFailedError(APIError, RuntimeError):
    """The engine failed while running a valid request."""


class InternalServerError(RequestFailedError):
    """An unexpected failure inside the engine (a bug, not the caller's input); the cause is chained."""


class APITimeoutError(APIError, TimeoutError):
    """A result was not ready within the given timeout."""


class APIConnectionError(APIError):
    """The engine could not be reached (kept for SDK compatibility; the local engine is in-process)."""
