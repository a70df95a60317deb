"""``retrieve_future``: how a client polls for the result of a work request (training, saves, sampling)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from tinker_cookbook.server.tinker_bodies import RetrieveFutureBody
from tinker_cookbook.server.tinker_routes.common import Routes, failed_future_body, parse
from tinker_cookbook.tinker import errors


def add_routes(routes: Routes, wait_s: float) -> None:
    """``wait_s``: how long one poll is held open before it answers try_again."""
    state, route = routes.state, routes.add

    @route("POST", "/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        body = await parse(request, RetrieveFutureBody)
        with state.lock:
            pending = state.futures.get(body.request_id)
        if pending is None:
            raise errors.NotFoundError(f"request_id={body.request_id!r} is unknown to this server (never issued, or "
                                       "its result was dropped long after it finished)")
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(pending.future)), wait_s)
        except TimeoutError:
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        except Exception as exc:  # noqa: BLE001 - the request failed: that is the future's answer
            return failed_future_body(exc)
        return pending.encode(result)
