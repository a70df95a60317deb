"""Sampling routes: sampling sessions (fixed weights a client samples from) and ``asample``."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from tinker_cookbook.server.tinker_bodies import (
    CreateSamplingSessionBody,
    JoinSamplingSessionBody,
    SampleBody,
)
from tinker_cookbook.server.tinker_routes.common import Routes, parse, proto_sample
from tinker_cookbook.tinker import errors, provenance, types
from tinker_cookbook.tinker.backend import SamplerHandle
from tinker_cookbook.tinker.futures import then


def add_routes(routes: Routes, max_num_samples: int) -> None:
    """``max_num_samples``: the most samples one ``asample`` request may ask for."""
    backend, state, route = routes.backend, routes.state, routes.add

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
        body = await parse(request, CreateSamplingSessionBody)
        state.session(body.session_id)
        handle = await routes.blocking(lambda: open_handle(body.base_model, body.model_path))
        return {"type": "create_sampling_session", "sampling_session_id": state.add_sampler(handle, body.session_id)}

    @route("POST", "/join_sampling_session")
    async def join_sampling_session(request: Request) -> Any:
        body = await parse(request, JoinSamplingSessionBody)
        return {"type": "join_sampling_session", "client_counter": next(state.sampler(body.sampling_session_id).clients)}

    @route("GET", "/samplers/{sampler_id}")
    async def get_sampler(request: Request, sampler_id: str) -> Any:
        sampler = state.sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    @route("POST", "/asample")
    async def asample(request: Request) -> Any:
        body = await parse(request, SampleBody)
        _check_sample_options(body, max_num_samples)
        if body.sampling_session_id is not None:
            handle = state.sampler(body.sampling_session_id).handle
        else:
            handle = await routes.blocking(lambda: open_handle(body.base_model, body.model_path))
        prompt_length = provenance.prompt_length(body.prompt)
        future = backend.sample(handle, body.prompt, body.num_samples, body.sampling_params,
                                bool(body.prompt_logprobs), body.topk_prompt_logprobs)
        # The ids go out now, with the future; they become usable in provenance spans once the samples exist.
        sequence_ids = provenance.new_sequence_ids(body.num_samples)
        recorded = then(future, lambda response: _recorded(state.sequences, sequence_ids, prompt_length, response))
        return state.track(recorded, proto_sample, sample_sequence_ids=sequence_ids)


STABILITY_INFO_REFUSAL = ("it records what the stable_reinforce loss trains on, and this server does not "
                          "provide that loss; create the sampling client with record_stability_info=False (the "
                          "default) and train with ppo, cispo, gspo or importance_sampling")


def _recorded(registry: provenance.SequenceRegistry, sequence_ids: list[str], prompt_length: int | None,
              response: types.SampleResponse) -> types.SampleResponse:
    registry.record(sequence_ids, prompt_length, response)
    return response


def _check_sample_options(body: SampleBody, max_num_samples: int) -> None:
    if not 1 <= body.num_samples <= max_num_samples:
        raise errors.BadRequestError(f"num_samples={body.num_samples} must be between 1 and {max_num_samples}")
    unsupported = {
        "topk_sample_logprobs": body.topk_sample_logprobs != 0,
        "target_prompt_logprobs": body.target_prompt_logprobs is not None,
        "prompt_alt_tokens_k": body.prompt_alt_tokens_k != 0,
        "prompt_logprobs_last_n": body.prompt_logprobs_last_n is not None,
        "record_stability_info": bool(body.record_stability_info),
    }
    for name, used in unsupported.items():
        if used:
            why = STABILITY_INFO_REFUSAL if name == "record_stability_info" else "leave it at its default"
            raise errors.BadRequestError(f"{name} is not supported by this server; {why}")
    if body.sampling_session_id is not None and (body.base_model or body.model_path):
        raise errors.BadRequestError("pass sampling_session_id or base_model/model_path, not both")
