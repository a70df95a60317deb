"""Service routes: health, the SDK's feature flags, server capabilities and the client session's lifetime."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from tinker_cookbook.server.tinker_bodies import ClientConfigBody, CreateSessionBody, SessionHeartbeatBody
from tinker_cookbook.server.tinker_routes.checkpoints import _paging
from tinker_cookbook.server.tinker_routes.common import Routes, merged_metadata, parse
from tinker_cookbook.server.tinker_sessions import SessionGone
from tinker_cookbook.tinker import errors

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


def add_routes(routes: Routes) -> None:
    state, route = routes.state, routes.add

    @route("GET", "/healthz")
    async def healthz(request: Request) -> Any:
        return {"status": "ok"}

    @route("POST", "/client/config")
    async def client_config(request: Request) -> Any:
        await parse(request, ClientConfigBody)
        return CLIENT_CONFIG

    @route("POST", "/client/dynamic_config")
    async def client_dynamic_config(request: Request) -> Any:
        await parse(request, ClientConfigBody)
        return DYNAMIC_CLIENT_CONFIG

    @route("GET", "/get_server_capabilities")
    async def get_server_capabilities(request: Request) -> Any:
        return await routes.blocking(routes.backend.capabilities)

    @route("POST", "/create_session")
    async def create_session(request: Request) -> Any:
        body = await parse(request, CreateSessionBody)
        state.expire_sessions()
        session_id = state.open_session(merged_metadata(None, body.user_metadata))
        return {"type": "create_session", "session_id": session_id}

    @route("POST", "/session_heartbeat")
    async def session_heartbeat(request: Request) -> Any:
        body = await parse(request, SessionHeartbeatBody)
        state.expire_sessions()
        state.session(body.session_id)
        return {"type": "session_heartbeat"}

    @route("POST", "/sessions/{session_id}/finish")
    async def finish_session(request: Request, session_id: str) -> Any:
        """The client is done: release the adapters and optimizer state of the session's training clients."""
        if state.has_ended(session_id):
            return {}  # finishing is idempotent: the first finish (or the expiry) already released everything
        try:
            state.session(session_id)
        except SessionGone:  # 410 tells a heartbeating client to stop; finishing an unknown session is a 404
            raise errors.NotFoundError(f"session_id={session_id!r} is not a session of this server") from None
        state.close_session(session_id)
        return {}

    @route("GET", "/sessions")
    async def list_sessions(request: Request) -> Any:
        limit, offset = _paging(request, 20)
        with state.lock:
            ids = list(state.sessions)
        return {"sessions": ids[offset:offset + limit]}

    @route("GET", "/sessions/{session_id}")
    async def get_session(request: Request, session_id: str) -> Any:
        session = state.session(session_id)
        with state.lock:
            return {"training_run_ids": list(session.model_ids),
                    "sampler_ids": list(session.sampler_ids), "user_metadata": session.user_metadata}

    @route("POST", "/telemetry")
    async def telemetry(request: Request) -> Any:
        return {"status": "accepted"}  # client telemetry is not collected

    @route("POST", "/cancel_future")
    async def cancel_future(request: Request) -> Any:
        return {}  # a sampling request runs to completion; its result is simply never fetched
