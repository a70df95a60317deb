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


class APIStatusError(APIError):
    """A request the service answered with an error status; ``status_code`` is the HTTP code the hosted service
    would use for the subclass (the local engine has no HTTP layer, so it is a class attribute)."""

    status_code: int = 500


class BadRequestError(APIStatusError, ValueError):
    """The request is malformed: a bad field value, a missing input, an unknown name."""

    status_code = 400


class UnprocessableEntityError(BadRequestError):
    """The request is well-formed but cannot be processed: an image for a text model, or a loss, gradient or
    update that overflows to NaN/inf (refused so that it never reaches the weights)."""

    status_code = 422


class NotFoundError(APIStatusError, LookupError):
    """A model, run or checkpoint does not exist."""

    status_code = 404


class ConflictError(APIStatusError):
    """The request conflicts with existing state (e.g. a checkpoint name already in use)."""

    status_code = 409


class AuthenticationError(APIStatusError):
    """Missing or invalid credentials on the hosted service. The local engine needs no API key and never raises
    it; it exists so that ``except`` clauses of code ported from the official SDK keep working."""

    status_code = 401


class BillingError(APIStatusError):
    """A billing problem on the hosted service. Never raised locally; kept for ported ``except`` clauses."""

    status_code = 402


class PermissionDeniedError(APIStatusError):
    """The credentials may not access the resource on the hosted service. Never raised locally (every local run
    and checkpoint belongs to the local user); kept for ported ``except`` clauses."""

    status_code = 403


class RateLimitError(APIStatusError):
    """Too many requests to the hosted service. The local engine queues requests instead of refusing them, so it
    never raises this; kept for ported ``except`` clauses (e.g. retry loops)."""

    status_code = 429


class RequestFailedError(APIError, RuntimeError):
    """The engine failed while running a valid request."""


class InternalServerError(RequestFailedError, APIStatusError):
    """An unexpected failure inside the engine (a bug, not the caller's input); the cause is chained."""

    status_code = 500


class APIResponseValidationError(APIError):
    """A response did not match its schema. Never raised locally (responses are built in-process as typed
    objects); kept for ported ``except`` clauses."""


class APIConnectionError(APIError):
    """The service could not be reached. The local engine is in-process, so this is never raised locally; kept
    for ported ``except`` clauses."""


class APITimeoutError(APIConnectionError, TimeoutError):
    """A result was not ready within the given timeout (``APIFuture.result(timeout=...)``)."""
