"""Training routes: creating training clients (fresh or from a checkpoint), their passes, optimizer steps,
saves and loads. Each work request answers with a future the client polls (``futures``)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tinker_cookbook.server import tinker_proto
from tinker_cookbook.server.tinker_bodies import (
    CreateModelBody,
    GetInfoBody,
    LoadWeightsBody,
    OptimStepBody,
    SaveWeightsBody,
    SaveWeightsForSamplerBody,
)
from tinker_cookbook.server.tinker_routes.common import (
    Routes,
    json_response,
    merged_metadata,
    parse,
    proto_forward_backward,
)
from tinker_cookbook.tinker import errors, types
from tinker_cookbook.tinker.futures import then


def add_routes(routes: Routes) -> None:
    backend, state, route = routes.backend, routes.state, routes.add

    @route("POST", "/create_model")
    async def create_model(request: Request) -> Any:
        body = await parse(request, CreateModelBody)
        session = state.session(body.session_id)
        lora = body.lora_config or types.LoraConfig(rank=32)
        metadata = merged_metadata(session.user_metadata, body.user_metadata)

        def create() -> types.CreateModelResponse:
            run_id = backend.create_session(body.base_model, lora, metadata)
            state.register_model(body.session_id, run_id, run_id)
            return types.CreateModelResponse(model_id=run_id)

        return state.track(state.in_thread(create), json_response)

    @route("POST", "/get_info")
    async def get_info(request: Request) -> Any:
        body = await parse(request, GetInfoBody)
        run_id = state.run_id(body.model_id)
        run = await routes.blocking(lambda: backend.store.get_run(run_id))
        model_data = await routes.blocking(lambda: backend.model_data(run.base_model))
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
        state.sequences.check(fields["data"])
        future = backend.forward(state.run_id(model_id), fields["data"], fields["loss_fn"],
                                 fields["loss_fn_config"], not fields["forward_only"])
        return state.track(future, proto_forward_backward, model_id)

    @route("POST", "/optim_step")
    async def optim_step(request: Request) -> Any:
        body = await parse(request, OptimStepBody)
        if body.adam_params is None:  # optimizer_params of another family is refused by its validator
            raise errors.BadRequestError("optim_step: adam_params is required (AdamParams)")
        future = backend.optim_step(state.run_id(body.model_id), body.adam_params)
        return state.track(future, json_response, body.model_id)

    @route("POST", "/save_weights")
    async def save_weights(request: Request) -> Any:
        body = await parse(request, SaveWeightsBody)
        name = _checkpoint_name(body.path)
        future = backend.save(state.run_id(body.model_id), "weights", name, body.ttl_seconds, body.overwrite)
        return state.track(then(future, lambda path: types.SaveWeightsResponse(path=path, type="save_weights")),
                           json_response, body.model_id)

    @route("POST", "/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> Any:
        body = await parse(request, SaveWeightsForSamplerBody)
        run_id = state.run_id(body.model_id)
        if body.path is not None:
            future = backend.save(run_id, "sampler_weights", _checkpoint_name(body.path), body.ttl_seconds, True)
            return state.track(then(future, lambda path: {"path": path, "type": "save_weights_for_sampler"}),
                               JSONResponse, body.model_id)
        # No name: an unnamed snapshot that only a sampling client can use (save_weights_and_get_sampling_client).
        snapshot = backend.snapshot(run_id, None)
        session_id = state.session_of_model(body.model_id)
        return state.track(
            then(snapshot, lambda handle: {"sampling_session_id": state.add_sampler(handle, session_id),
                                            "type": "save_weights_for_sampler"}),
            JSONResponse, body.model_id)

    @route("POST", "/load_weights")
    async def load_weights(request: Request) -> Any:
        body = await parse(request, LoadWeightsBody)
        if body.session_id is not None:
            # Create-via-load: a new training client holding the checkpoint (create_training_client_from_state).
            if body.model_seq_id is None:
                raise errors.BadRequestError("load_weights: session_id needs model_seq_id")
            session_id = body.session_id
            session = state.session(session_id)
            # The SDK derives this id itself, as the hosted service does: the n-th training client of the session.
            model_id = f"{session_id}:train:{body.model_seq_id}"
            metadata = merged_metadata(session.user_metadata, body.user_metadata)

            def create() -> types.LoadWeightsResponse:
                run_id, _, _ = backend.create_session_from_state(body.path, body.optimizer, metadata)
                state.register_model(session_id, model_id, run_id)
                return types.LoadWeightsResponse(path=body.path, model_id=model_id, type="load_weights")

            return state.track(state.in_thread(create), json_response, model_id)
        if body.model_id is None:
            raise errors.BadRequestError("load_weights: pass model_id (an existing training client) or session_id "
                                         "and model_seq_id (a new one)")
        future = backend.load(state.run_id(body.model_id), body.path, body.optimizer)
        return state.track(future, json_response, body.model_id)


def _checkpoint_name(path: str | None) -> str:
    if not path:
        raise errors.BadRequestError("path: a checkpoint name is required, e.g. 'step-100'")
    return path
