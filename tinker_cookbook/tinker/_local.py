"""The bridge from the API contract to the in-process engine: the only module of ``tinker/`` that imports it.

The imports are deferred to the first call, so ``from tinker_cookbook import tinker`` loads no engine (torch,
peft, models) until a client is created.
"""

from __future__ import annotations

from tinker_cookbook.tinker._backend import Backend, CheckpointStoreAPI


def local_backend() -> Backend:
    """The process-wide local engine (shared by every client, so base models are loaded once)."""
    from tinker_cookbook.engine.backend import LocalBackend

    return LocalBackend.default()


def local_store() -> CheckpointStoreAPI:
    """The local checkpoint store (``$TINKER_COOKBOOK_HOME``)."""
    from tinker_cookbook.engine.checkpoint_store import CheckpointStore

    return CheckpointStore()
