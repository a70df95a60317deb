"""The Tinker wire-protocol routes (what the official ``tinker`` SDK calls).

Placeholder: the routes come from the ``server-tinker`` branch, which replaces this module when merged.
"""

from __future__ import annotations

from fastapi import APIRouter

from tinker_cookbook.tinker._backend import Backend


def build_router(backend: Backend) -> APIRouter:
    return APIRouter()
