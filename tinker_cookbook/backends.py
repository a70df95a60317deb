"""Which backend serves ``ServiceClient(base_url=...)``: the wiring between the API contract and its backends.

The contract (``tinker_cookbook.tinker``) never imports the engine; it imports this module by name on first use,
and this module registers the factories below. ``base_url`` None, "" or "local" selects the in-process engine (one
per process, shared by every client); any other value is a Tinker-protocol server, reached through the official
``tinker`` SDK (``pip install tinker_cookbook[remote]``).

This is the only module besides the engine itself that imports ``tinker_cookbook.engine``; the imports are
deferred to the first client, so ``from tinker_cookbook import tinker`` stays free of torch.
"""

from __future__ import annotations

from tinker_cookbook.tinker._backend import Backend, CheckpointStoreAPI, register_backend_factories

LOCAL_BASE_URLS = (None, "", "local")


def is_local(base_url: str | None) -> bool:
    """True when ``base_url`` names the in-process engine rather than a server."""
    return base_url in LOCAL_BASE_URLS


def local_backend() -> Backend:
    """The process-wide in-process engine (base models are loaded once and shared)."""
    from tinker_cookbook.engine.backend import LocalBackend

    return LocalBackend.default()


def backend_for(base_url: str | None, api_key: str | None = None) -> Backend:
    if is_local(base_url):
        return local_backend()
    from tinker_cookbook.tinker._remote import RemoteBackend

    return RemoteBackend(str(base_url), api_key)


def store_for(base_url: str | None, api_key: str | None = None) -> CheckpointStoreAPI:
    if is_local(base_url):
        from tinker_cookbook.engine.checkpoint_store import CheckpointStore

        return CheckpointStore()
    from tinker_cookbook.tinker._remote import RemoteStore

    return RemoteStore.connect(str(base_url), api_key)


register_backend_factories(backend_for, store_for)
