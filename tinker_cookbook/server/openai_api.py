"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``.

The model of a request is a base model the backend serves (see ``GET /v1/models``) or a ``tinker://`` sampler
checkpoint path. Every request becomes one ``backend.sample`` call per prompt with ``num_samples = n``, so the
engine's sampler batches a request's samples, and concurrent requests, together.

Chat messages are rendered with this project's renderers (not a Jinja chat template): by default the renderer
stored with a checkpoint's training run, else the model's recommended one; the extra body field ``renderer``
picks another (``extra_body={"renderer": "role_colon"}`` in the OpenAI client). Sampling stops at the
renderer's stop sequences and at the request's ``stop`` strings; the reply is parsed by the renderer, and
reasoning (Qwen3's ``<think>``) comes back as ``message.reasoning_content``.

Supported: ``n``, ``temperature``, ``top_p``, ``top_k`` (extension), ``max_tokens`` / ``max_completion_tokens``,
``stop``, ``seed``, ``stream`` (with ``stream_options.include_usage``), the logprobs of the sampled tokens
(completions ``logprobs=0``; chat ``logprobs=true`` with ``top_logprobs`` 0 or unset), and tool calling through the
renderer's tool format (``tools``, ``tool_choice``, ``tool`` messages, ``tool_calls`` both ways). Every other field
of OpenAI's request schema is accepted too: those that do not change sampling here are ignored and named in the
reply's ``Warning`` header (``IGNORED`` of each body class); those this engine cannot honour (penalties,
``logit_bias``, ``echo``, ``suffix``, ``best_of`` > ``n``, top alternatives of logprobs, JSON response formats,
audio, web search) get a 400 that says so. Fields outside OpenAI's schema get a 400 too.

Streaming samples the whole completion first, then sends it as Server-Sent Events in OpenAI's chunk format.

This module mounts the routes and answers ``/v1/models``; the request bodies and their shared checks live in
``openai_bodies``, the served models in ``openai_models``, and the two sampling routes in ``openai_routes``
(``completions``, ``chat``, and ``common`` for what they share).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tinker_cookbook.server.app import ServerLimits, error_response
from tinker_cookbook.server.openai_bodies import OWNER
from tinker_cookbook.server.openai_models import ModelRegistry
from tinker_cookbook.server.openai_routes.chat import chat_completions
from tinker_cookbook.server.openai_routes.completions import completions
from tinker_cookbook.tinker.backend import Backend


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": OWNER}


def build_router(backend: Backend[Any], limits: ServerLimits | None = None,
                 registry: ModelRegistry | None = None) -> APIRouter:
    """The OpenAI-compatible routes over ``backend`` (``registry``: the loaded models, to share or preload)."""
    limits = limits or ServerLimits()
    registry = registry or ModelRegistry(backend)
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def list_models() -> Any:
        names = [*registry.base_model_names(refresh=True), *registry.loaded_checkpoints()]
        return {"object": "list", "data": [_model_card(n) for n in names]}

    @router.get("/models/{model:path}")
    async def get_model(model: str) -> Any:
        if model in registry.base_model_names() or model in registry.loaded_checkpoints():
            return _model_card(model)
        return error_response(404, f"model {model!r} is not served here; GET /v1/models lists the models "
                                   "(a tinker:// checkpoint is listed once a request has used it)", "model")

    @router.post("/completions")
    async def create_completion(request: Request) -> Any:
        return await completions(request, backend, registry, limits)

    @router.post("/chat/completions")
    async def create_chat_completion(request: Request) -> Any:
        return await chat_completions(request, backend, registry, limits)

    return router
