"""REST routes over the backend's checkpoint store: training runs, checkpoints, weights info, deleting,
publishing and TTLs. A run id in a path may also be a model id this server handed out."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from tinker_cookbook.server.tinker_bodies import TtlBody, WeightsInfoBody
from tinker_cookbook.server.tinker_routes.common import Routes, parse
from tinker_cookbook.tinker import errors, types


def add_routes(routes: Routes) -> None:
    state, route, store = routes.state, routes.add, routes.backend.store

    @route("GET", "/training_runs")
    async def list_training_runs(request: Request) -> Any:
        limit, offset = _paging(request, 20)
        return await routes.blocking(lambda: store.list_runs(limit=limit, offset=offset))

    @route("GET", "/training_runs/{run_id}")
    async def get_training_run(request: Request, run_id: str) -> Any:
        return await routes.blocking(lambda: store.get_run(state.training_run_id(run_id)))

    @route("GET", "/training_runs/{run_id}/checkpoints")
    async def list_checkpoints(request: Request, run_id: str) -> Any:
        return await routes.blocking(lambda: store.list_checkpoints(state.training_run_id(run_id)))

    @route("GET", "/checkpoints")
    async def list_user_checkpoints(request: Request) -> Any:
        limit, offset = _paging(request, 100)
        return await routes.blocking(lambda: store.list_user_checkpoints(limit=limit, offset=offset))

    @route("POST", "/weights_info")
    async def weights_info(request: Request) -> Any:
        body = await parse(request, WeightsInfoBody)
        return await routes.blocking(lambda: store.weights_info(body.tinker_path))

    def checkpoint_path(run_id: str, kind: str, name: str) -> str:
        if kind not in types.CHECKPOINT_KINDS:
            raise errors.BadRequestError(f"checkpoint kind {kind!r} must be 'weights' or 'sampler_weights'")
        return types.format_tinker_path(state.training_run_id(run_id), kind, name)

    @route("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}")
    async def delete_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Any:
        await routes.blocking(lambda: store.delete_checkpoint(checkpoint_path(run_id, kind, name)))
        return {}

    @route("POST", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def publish_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Any:
        await routes.blocking(lambda: store.set_public(checkpoint_path(run_id, kind, name), True))
        return {}

    @route("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def unpublish_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Any:
        await routes.blocking(lambda: store.set_public(checkpoint_path(run_id, kind, name), False))
        return {}

    @route("PUT", "/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
    async def set_checkpoint_ttl(request: Request, run_id: str, kind: str, name: str) -> Any:
        body = await parse(request, TtlBody)
        await routes.blocking(lambda: store.set_ttl(checkpoint_path(run_id, kind, name), body.ttl_seconds))
        return {}


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
