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

Not handled here (the app that mounts this router does it): authentication (the SDK sends its key, which must start
with ``tml-``, in the ``X-API-Key`` header) and request size limits (protobuf ``forward_backward`` bodies reach
several MB: the SDK splits batches at about 5 MB).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from tinker_cookbook.server import tinker_proto
from tinker_cookbook.server.tinker_bodies import (  # the protocol's request schemas
    ClientConfigBody,
    CreateModelBody,
    CreateSamplingSessionBody,
    CreateSessionBody,
    GetInfoBody,
    JoinSamplingSessionBody,
    LoadWeightsBody,
    OptimStepBody,
    RetrieveFutureBody,
    SampleBody,
    SaveWeightsBody,
    SaveWeightsForSamplerBody,
    SessionHeartbeatBody,
    TtlBody,
    WeightsInfoBody,
)
from tinker_cookbook.server.tinker_sessions import SessionGone, State
from tinker_cookbook.tinker import errors, types
from tinker_cookbook.tinker.backend import Backend, SamplerHandle
from tinker_cookbook.tinker.futures import then

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

RETRIEVE_WAIT_S = 35.0
"""How long ``retrieve_future`` holds a poll open before answering try_again: below the SDK's 45 s per poll, and
long, because the SDK logs a warning for every try_again."""
MAX_NUM_SAMPLES = 128
"""The most samples one ``asample`` request may ask for."""
PROTOBUF = "application/x-protobuf"

# The SDK's feature flags, pinned to the behaviour this server implements: plain API keys, uncompressed protobuf
# forward_backward bodies sent in order, per-request polling, custom losses computed by the client.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "sample_no_retries": False,
}
DYNAMIC_CLIENT_CONFIG = {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


# -- encoding answers and errors ------------------------------------------------------------------------------------

def _json(model: BaseModel) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json", exclude_none=True))


def _proto_fb(output: types.ForwardBackwardOutput) -> Response:
    return Response(tinker_proto.encode_forward_backward_output(output), media_type=PROTOBUF)


def _proto_sample(response: types.SampleResponse) -> Response:
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
    """``<ErrorClass>: message``: the class lets a client re-raise the same error type."""
    return f"{type(exc).__name__}: {exc}"


def error_response(exc: BaseException) -> JSONResponse:
    status = _status_of(exc)
    return JSONResponse({"detail": _describe(exc), "type": type(exc).__name__}, status_code=status)


def _failed_future_body(exc: BaseException) -> dict[str, str]:
    return {"error": _describe(exc), "category": "user" if _status_of(exc) < 500 else "server"}


async def _parse(request: Request, model: type[M]) -> M:
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
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


# -- the router -----------------------------------------------------------------------------------------------

def build_router(backend: Backend[Any]) -> APIRouter:  # noqa: C901 - one closure per route reads best here
    """All Tinker-protocol routes, served by ``backend``."""
    state = State(backend)
    router = APIRouter(prefix="/api/v1")

    def route(method: str, path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register an async handler; any exception becomes an error response, never a crash."""
        def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
            async def endpoint(request: Request) -> Response:
                try:
                    result = await handler(request, **request.path_params)
                except Exception as exc:  # noqa: BLE001 - every failure is answered with its status
                    return error_response(exc)
                if isinstance(result, Response):
                    return result
                if isinstance(result, BaseModel):
                    return _json(result)
                return JSONResponse(result)

            endpoint.__name__ = handler.__name__
            router.add_api_route(path, endpoint, methods=[method], include_in_schema=True)
            return handler

        return wrap

    async def blocking(fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(state.in_thread(fn))

    # -- service ---------------------------------------------------------------------------------------------
    @route("GET", "/healthz")
    async def healthz(request: Request) -> Any:
        return {"status": "ok"}

    @route("POST", "/client/config")
    async def client_config(request: Request) -> Any:
        await _parse(request, ClientConfigBody)
        return CLIENT_CONFIG

    @route("POST", "/client/dynamic_config")
    async def client_dynamic_config(request: Request) -> Any:
        await _parse(request, ClientConfigBody)
        return DYNAMIC_CLIENT_CONFIG

    @route("GET", "/get_server_capabilities")
    async def get_server_capabilities(request: Request) -> Any:
        return await blocking(backend.capabilities)

    @route("POST", "/create_session")
    async def create_session(request: Request) -> Any:
        body = await _parse(request, CreateSessionBody)
        state.expire_sessions()
        metadata = {str(k): str(v) for k, v in body.user_metadata.items()} if body.user_metadata else None
        session_id = state.open_session(metadata)
        return {"type": "create_session", "session_id": session_id}

    @route("POST", "/session_heartbeat")
    async def session_heartbeat(request: Request) -> Any:
        body = await _parse(request, SessionHeartbeatBody)
        state.expire_sessions()
        state.session(body.session_id)
        return {"type": "session_heartbeat"}

    @route("POST", "/sessions/{session_id}/finish")
    async def finish_session(request: Request, session_id: str) -> Any:
        """The client is done: release the adapters and optimizer state of the session's training clients."""
        state.close_session(session_id)
        return {}

    @route("POST", "/telemetry")
    async def telemetry(request: Request) -> Any:
        return {"status": "accepted"}  # client telemetry is not collected

    @route("POST", "/cancel_future")
    async def cancel_future(request: Request) -> Any:
        return {}  # a sampling request runs to completion; its result is simply never fetched

    # -- training --------------------------------------------------------------------------------------------
    def register_model(session_id: str, model_id: str, run_id: str) -> None:
        with state.lock:
            session = state.sessions.get(session_id)
            if session is None:  # the session ended while the model was being created: free it again
                backend.close_session(run_id)
                raise SessionGone(f"session_id={session_id!r} ended while its training client was being created")
            state.models[model_id] = run_id
            state.model_sessions[model_id] = session_id
            session.model_ids.append(model_id)

    @route("POST", "/create_model")
    async def create_model(request: Request) -> Any:
        body = await _parse(request, CreateModelBody)
        session = state.session(body.session_id)
        lora = body.lora_config or types.LoraConfig(rank=32)
        metadata = _metadata(session.user_metadata, body.user_metadata)

        def create() -> types.CreateModelResponse:
            run_id = backend.create_session(body.base_model, lora, metadata)
            register_model(body.session_id, run_id, run_id)
            return types.CreateModelResponse(model_id=run_id)

        return state.track(state.in_thread(create), _json)

    @route("POST", "/get_info")
    async def get_info(request: Request) -> Any:
        body = await _parse(request, GetInfoBody)
        run_id = state.run_id(body.model_id)
        run = await blocking(lambda: backend.store.get_run(run_id))
        model_data = await blocking(lambda: backend.model_data(run.base_model))
        return types.GetInfoResponse(type="get_info", model_id=body.model_id, model_data=model_data, is_lora=True,
                                     lora_rank=run.lora_rank, model_name=run.base_model)

    @route("POST", "/forward_backward")
    async def forward_backward(request: Request) -> Any:
        if request.headers.get("content-encoding", "identity") not in ("identity", ""):
            raise errors.BadRequestError("forward_backward: compressed bodies are not accepted; send plain protobuf")
        raw = await request.body()
        try:
            fields = tinker_proto.decode_forward_backward_request(raw)
        except (tinker_proto.ProtoError, ValidationError) as exc:
            raise errors.BadRequestError(f"forward_backward: the protobuf body is malformed: {exc}") from None
        model_id = fields["model_id"]
        future = backend.forward(state.run_id(model_id), fields["data"], fields["loss_fn"],
                                 fields["loss_fn_config"], not fields["forward_only"])
        return state.track(future, _proto_fb, model_id)

    @route("POST", "/optim_step")
    async def optim_step(request: Request) -> Any:
        body = await _parse(request, OptimStepBody)
        future = backend.optim_step(state.run_id(body.model_id), body.adam_params)
        return state.track(future, _json, body.model_id)

    @route("POST", "/save_weights")
    async def save_weights(request: Request) -> Any:
        body = await _parse(request, SaveWeightsBody)
        name = _checkpoint_name(body.path)
        future = backend.save(state.run_id(body.model_id), "weights", name, body.ttl_seconds, body.overwrite)
        return state.track(then(future, lambda path: types.SaveWeightsResponse(path=path, type="save_weights")),
                           _json, body.model_id)

    @route("POST", "/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> Any:
        body = await _parse(request, SaveWeightsForSamplerBody)
        run_id = state.run_id(body.model_id)
        if body.path is not None:
            future = backend.save(run_id, "sampler_weights", _checkpoint_name(body.path), body.ttl_seconds, True)
            return state.track(then(future, lambda path: {"path": path, "type": "save_weights_for_sampler"}),
                               JSONResponse, body.model_id)
        # No name: an unnamed snapshot that only a sampling client can use (save_weights_and_get_sampling_client).
        snapshot = backend.snapshot(run_id, None)
        with state.lock:
            session_id = state.model_sessions.get(body.model_id, "")
        return state.track(
            then(snapshot, lambda handle: {"sampling_session_id": state.add_sampler(handle, session_id),
                                            "type": "save_weights_for_sampler"}),
            JSONResponse, body.model_id)

    @route("POST", "/load_weights")
    async def load_weights(request: Request) -> Any:
        body = await _parse(request, LoadWeightsBody)
        if body.session_id is not None:
            # Create-via-load: a new training client holding the checkpoint (create_training_client_from_state).
            if body.model_seq_id is None:
                raise errors.BadRequestError("load_weights: session_id needs model_seq_id")
            session_id = body.session_id
            session = state.session(session_id)
            # The SDK derives this id itself, as the hosted service does: the n-th training client of the session.
            model_id = f"{session_id}:train:{body.model_seq_id}"
            metadata = _metadata(session.user_metadata, body.user_metadata)

            def create() -> types.LoadWeightsResponse:
                run_id, _, _ = backend.create_session_from_state(body.path, body.optimizer, metadata)
                register_model(session_id, model_id, run_id)
                return types.LoadWeightsResponse(path=body.path, type="load_weights")

            return state.track(state.in_thread(create), _json, model_id)
        if body.model_id is None:
            raise errors.BadRequestError("load_weights: pass model_id (an existing training client) or session_id "
                                         "and model_seq_id (a new one)")
        future = backend.load(state.run_id(body.model_id), body.path, body.optimizer)
        return state.track(future, _json, body.model_id)

    # -- sampling --------------------------------------------------------------------------------------------
    def open_handle(base_model: str | None, model_path: str | None) -> SamplerHandle:
        # A model_path names its base model itself; base_model alone samples the base model.
        if model_path:
            return backend.handle_for_path(model_path)
        if base_model:
            return backend.handle_for_base(base_model)
        raise errors.BadRequestError("pass base_model (sample the base model) or model_path (a sampler_weights "
                                     "checkpoint)")

    @route("POST", "/create_sampling_session")
    async def create_sampling_session(request: Request) -> Any:
        body = await _parse(request, CreateSamplingSessionBody)
        state.session(body.session_id)
        handle = await blocking(lambda: open_handle(body.base_model, body.model_path))
        return {"type": "create_sampling_session", "sampling_session_id": state.add_sampler(handle, body.session_id)}

    @route("POST", "/join_sampling_session")
    async def join_sampling_session(request: Request) -> Any:
        body = await _parse(request, JoinSamplingSessionBody)
        return {"type": "join_sampling_session", "client_counter": next(state.sampler(body.sampling_session_id).clients)}

    @route("GET", "/samplers/{sampler_id}")
    async def get_sampler(request: Request, sampler_id: str) -> Any:
        sampler = state.sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    @route("POST", "/asample")
    async def asample(request: Request) -> Any:
        body = await _parse(request, SampleBody)
        _check_sample_options(body)
        if body.sampling_session_id is not None:
            handle = state.sampler(body.sampling_session_id).handle
        else:
            handle = await blocking(lambda: open_handle(body.base_model, body.model_path))
        future = backend.sample(handle, body.prompt, body.num_samples, body.sampling_params,
                                bool(body.prompt_logprobs), body.topk_prompt_logprobs)
        request_id_prefix = secrets.token_hex(6)
        sequence_ids = [f"seq-{request_id_prefix}-{i}" for i in range(body.num_samples)]
        return state.track(future, _proto_sample, sample_sequence_ids=sequence_ids)

    # -- futures ---------------------------------------------------------------------------------------------
    @route("POST", "/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        body = await _parse(request, RetrieveFutureBody)
        with state.lock:
            pending = state.futures.get(body.request_id)
        if pending is None:
            raise errors.NotFoundError(f"request_id={body.request_id!r} is unknown to this server (never issued, or "
                                       "its result was dropped long after it finished)")
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(pending.future)), RETRIEVE_WAIT_S)
        except TimeoutError:
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        except Exception as exc:  # noqa: BLE001 - the request failed: that is the future's answer
            return _failed_future_body(exc)
        return pending.encode(result)

    # -- REST: runs and checkpoints --------------------------------------------------------------------------
    store = backend.store

    @route("GET", "/training_runs")
    async def list_training_runs(request: Request) -> Any:
        limit, offset = _paging(request, 20)
        return await blocking(lambda: store.list_runs(limit=limit, offset=offset))

    @route("GET", "/training_runs/{run_id}")
    async def get_training_run(request: Request, run_id: str) -> Any:
        return await blocking(lambda: store.get_run(state.training_run_id(run_id)))

    @route("GET", "/training_runs/{run_id}/checkpoints")
    async def list_checkpoints(request: Request, run_id: str) -> Any:
        return await blocking(lambda: store.list_checkpoints(state.training_run_id(run_id)))

    @route("GET", "/checkpoints")
    async def list_user_checkpoints(request: Request) -> Any:
        limit, offset = _paging(request, 100)
        return await blocking(lambda: store.list_user_checkpoints(limit=limit, offset=offset))

    @route("POST", "/weights_info")
    async def weights_info(request: Request) -> Any:
        body = await _parse(request, WeightsInfoBody)
        return await blocking(lambda: store.weights_info(body.tinker_path))

    def checkpoint_path(run_id: str, kind: str, name: str) -> str:
        if kind not in ("weights", "sampler_weights"):
            raise errors.BadRequestError(f"checkpoint kind {kind!r} must be 'weights' or 'sampler_weights'")
        return f"tinker://{state.training_run_id(run_id)}/{kind}/{name}"

    @route("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}")
    async def delete_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Any:
        await blocking(lambda: store.delete_checkpoint(checkpoint_path(run_id, kind, name)))
        return {}

    @route("POST", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def publish_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Any:
        await blocking(lambda: store.set_public(checkpoint_path(run_id, kind, name), True))
        return {}

    @route("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def unpublish_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Any:
        await blocking(lambda: store.set_public(checkpoint_path(run_id, kind, name), False))
        return {}

    @route("PUT", "/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
    async def set_checkpoint_ttl(request: Request, run_id: str, kind: str, name: str) -> Any:
        body = await _parse(request, TtlBody)
        await blocking(lambda: store.set_ttl(checkpoint_path(run_id, kind, name), body.ttl_seconds))
        return {}

    return router


# -- helpers ----------------------------------------------------------------------------------------------------

def _metadata(session: dict[str, str] | None, request: dict[str, Any] | None) -> dict[str, str] | None:
    merged = {**(session or {}), **{str(k): str(v) for k, v in (request or {}).items()}}
    return merged or None


def _checkpoint_name(path: str | None) -> str:
    if not path:
        raise errors.BadRequestError("path: a checkpoint name is required, e.g. 'step-100'")
    return path


def _check_sample_options(body: SampleBody) -> None:
    if not 1 <= body.num_samples <= MAX_NUM_SAMPLES:
        raise errors.BadRequestError(f"num_samples={body.num_samples} must be between 1 and {MAX_NUM_SAMPLES}")
    unsupported = {
        "topk_sample_logprobs": body.topk_sample_logprobs != 0,
        "target_prompt_logprobs": body.target_prompt_logprobs is not None,
        "prompt_alt_tokens_k": body.prompt_alt_tokens_k != 0,
        "prompt_logprobs_last_n": body.prompt_logprobs_last_n is not None,
        "record_stability_info": bool(body.record_stability_info),
    }
    for name, used in unsupported.items():
        if used:
            raise errors.BadRequestError(f"{name} is not supported by this server; leave it at its default")
    if body.sampling_session_id is not None and (body.base_model or body.model_path):
        raise errors.BadRequestError("pass sampling_session_id or base_model/model_path, not both")


def _paging(request: Request, default_limit: int) -> tuple[int, int]:
    def number(name: str, default: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise errors.BadRequestError(f"{name}={raw!r} is not an integer") from None
        if value < 0:
            raise errors.BadRequestError(f"{name}={value} must not be negative")
        return value

    return number("limit", default_limit), number("offset", 0)
