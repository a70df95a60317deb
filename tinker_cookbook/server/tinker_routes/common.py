"""What every route group of the Tinker protocol shares: the ``Routes`` it registers on, request parsing and the
encoding of answers and errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from tinker_cookbook.server import tinker_proto
from tinker_cookbook.server.guards import internal_error_text, public_text
from tinker_cookbook.server.json_input import read_json
from tinker_cookbook.server.tinker_sessions import State
from tinker_cookbook.tinker import errors, types
from tinker_cookbook.tinker.backend import Backend

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Handler = Callable[..., Awaitable[Any]]

PROTOBUF = "application/x-protobuf"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Routes:
    """The router that route groups add to, the backend they serve and the bookkeeping they share."""

    backend: Backend[Any]
    state: State
    router: APIRouter

    def add(self, method: str, path: str) -> Callable[[Handler], Handler]:
        """Register an async handler; any exception becomes an error response, never a crash.

        A handler takes the request and the path parameters and returns a ``Response``, a pydantic model (sent as
        JSON without its None fields) or anything ``JSONResponse`` takes.
        """
        def wrap(handler: Handler) -> Handler:
            async def endpoint(request: Request) -> Response:
                try:
                    result = await handler(request, **request.path_params)
                except Exception as exc:  # noqa: BLE001 - every failure is answered with its status
                    return error_response(exc)
                if isinstance(result, Response):
                    return result
                if isinstance(result, BaseModel):
                    return json_response(result)
                return JSONResponse(result)

            endpoint.__name__ = handler.__name__
            self.router.add_api_route(path, endpoint, methods=[method], include_in_schema=True)
            return handler

        return wrap

    async def blocking(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the worker threads, so that a slow backend call never stalls the event loop."""
        return await asyncio.wrap_future(self.state.in_thread(fn))


# -- encoding answers and errors ------------------------------------------------------------------------------------

def json_response(model: BaseModel) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json", exclude_none=True))


def proto_forward_backward(output: types.ForwardBackwardOutput) -> Response:
    return Response(tinker_proto.encode_forward_backward_output(output), media_type=PROTOBUF)


def proto_sample(response: types.SampleResponse) -> Response:
    return Response(tinker_proto.encode_sample_response(response), media_type=PROTOBUF)


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, errors.ConflictError):
        # The SDK retries 409 for minutes; a name clash does not go away by retrying, so it is a plain 400.
        return 400
    if isinstance(exc, errors.APIStatusError):
        return exc.status_code
    if isinstance(exc, errors.TinkerError | ValueError) and not isinstance(exc, errors.RequestFailedError):
        return 400
    return 500


def _describe(exc: BaseException) -> str:
    """``<ErrorClass>: message``: the class lets a client re-raise the same error type. The message never holds
    a path of this machine; a failure that is a bug (not an API error) is named by its class only, and logged."""
    if _status_of(exc) >= 500 and not isinstance(exc, errors.TinkerError):
        logger.error("request failed", exc_info=exc)
        return f"{errors.InternalServerError.__name__}: {internal_error_text(exc)}"
    return f"{type(exc).__name__}: {public_text(str(exc))}"


def error_response(exc: BaseException) -> JSONResponse:
    """A direct request's failure: the HTTP status the SDK maps to its exception class."""
    status = _status_of(exc)
    return JSONResponse({"detail": _describe(exc), "type": type(exc).__name__}, status_code=status)


def failed_future_body(exc: BaseException) -> dict[str, str]:
    """A polled request's failure, which the SDK raises as ``RequestFailedError``."""
    return {"error": _describe(exc), "category": "user" if _status_of(exc) < 500 else "server"}


# -- parsing requests -----------------------------------------------------------------------------------------------

async def parse(request: Request, model: type[M]) -> M:
    """The JSON body as ``model``; a 400 that names the unknown or wrong fields otherwise."""
    raw = await request.body() or b"{}"
    read_json(raw)  # depth, integer range and text checks that name the field
    try:
        return model.model_validate_json(raw, strict=True)  # no coercion: "2" is not a number, "true" no bool
    except ValidationError as exc:
        raise errors.BadRequestError(f"{request.url.path}: {_validation_summary(exc)}") from None


def _validation_summary(exc: ValidationError) -> str:
    problems = []
    for item in exc.errors()[:5]:
        where = ".".join(str(part) for part in item["loc"]) or "body"
        if item["type"] == "extra_forbidden":
            problems.append(f"unknown field {where!r}")
        elif item["type"] == "json_invalid":
            problems.append(f"the body is not valid JSON ({item['msg']})")
        else:
            problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


def merged_metadata(session: dict[str, str] | None, request: dict[str, Any] | None) -> dict[str, str] | None:
    """A training client's user metadata: its session's, overridden by the request's (values as strings)."""
    merged = {**(session or {}), **{str(k): str(v) for k, v in (request or {}).items()}}
    return merged or None
