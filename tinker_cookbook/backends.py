"""Which backend serves ``ServiceClient(base_url=...)``: the wiring between the API contract and its backends.

The contract (``tinker_cookbook.tinker``) never imports the engine; it imports this module by name on first use,
and this module registers the factories below. ``base_url`` None, "" or "local" selects the in-process engine (one
per process, shared by every client); any other value is a Tinker-protocol server, reached through the official
``tinker`` SDK (``pip install 'tinker==0.38.0'``).

It also says where the in-process engine's base models live as files (``base_model_dir``), which the weights tools
merge adapters into. This is the only module besides the engine itself that imports ``tinker_cookbook.engine``; the imports are
deferred to the first client, so ``from tinker_cookbook import tinker`` stays free of torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from tinker_cookbook.tinker.backend import Backend, CheckpointStoreAPI, register_backend_factories
from tinker_cookbook.tinker.errors import BadRequestError

if TYPE_CHECKING:
    from tinker_cookbook.tinker._remote import RemoteSamplerHandle

LOCAL_BASE_URLS = (None, "", "local")
LOST_RANK_STATUS = 75
"""The exit status of a rank that stops because another rank stopped (so a launcher can tell the cause apart)."""


def is_local(base_url: str | None) -> bool:
    """True when ``base_url`` names the in-process engine rather than a server."""
    return base_url in LOCAL_BASE_URLS


def local_backend() -> Backend[Any]:
    """The process-wide in-process engine (base models are loaded once and shared).

    Under ``torchrun`` with several ranks it is the data-parallel engine (``docs/scaling.md``): rank 0 gets it,
    and on every other rank this call runs rank 0's commands until rank 0 closes, then exits the process.
    """
    from tinker_cookbook.engine.backend import LocalBackend
    from tinker_cookbook.engine.ranks import launched_by_torchrun

    if launched_by_torchrun():
        backend = serving_backend()
        if backend is None:
            raise SystemExit(0)  # this rank served rank 0 until it closed: nothing else runs here
        return backend
    return LocalBackend.default()


def launched_with_ranks() -> bool:
    """Whether this process is one of several ranks that ``torchrun`` started."""
    from tinker_cookbook.engine.ranks import launched_by_torchrun

    return launched_by_torchrun()


def serving_backend(on_failure: Callable[[str], None] | None = None) -> Backend[Any] | None:
    """The in-process engine; under ``torchrun``, on rank 0 the data-parallel engine over all ranks (closed at
    exit, which stops the other ranks) and on any other rank None, once rank 0's commands are done (this call runs
    them). ``on_failure(message)``: called once if a rank stops while the engine is open."""
    from tinker_cookbook.engine.backend import LocalBackend
    from tinker_cookbook.engine.ranks import launched_backend, launched_by_torchrun

    if not launched_by_torchrun():
        return LocalBackend.default()
    return launched_backend(on_failure, LOST_RANK_STATUS)


def base_model_dir(base_model: str) -> Path:
    """A Hugging Face folder (``config.json`` + safetensors) with the weights the in-process engine loads for
    ``base_model``: the hub snapshot, or for the engine's own models (tiny test models, the packaged SmolLM2, custom
    registered ones) a copy saved once in the cache. What merging an adapter into full weights starts from."""
    from tinker_cookbook.engine.models import base_model_dir as engine_base_model_dir

    return engine_base_model_dir(base_model)


def check_server_url(base_url: object) -> str:
    """``base_url`` as a server URL, or a BadRequestError that says what the field takes."""
    parsed = urlparse(base_url) if isinstance(base_url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BadRequestError(
            f"base_url={base_url!r} is neither the local engine nor a server URL; omit it (or pass 'local') to run "
            "in this process, or pass the http(s):// URL of a Tinker-protocol server, e.g. http://127.0.0.1:8000"
        )
    return str(base_url)


def remote_backend(base_url: str, api_key: str | None = None) -> Backend[RemoteSamplerHandle]:
    """A backend that sends every request to the Tinker-protocol server at ``base_url``."""
    from tinker_cookbook.tinker._remote import RemoteBackend

    return RemoteBackend(base_url, api_key)


def backend_for(base_url: str | None, api_key: str | None = None) -> Backend[Any]:
    if is_local(base_url):
        return local_backend()
    return remote_backend(check_server_url(base_url), api_key)


def store_for(base_url: str | None, api_key: str | None = None) -> CheckpointStoreAPI:
    if is_local(base_url):
        from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore

        return CheckpointStore()
    url = check_server_url(base_url)
    from tinker_cookbook.tinker._remote import RemoteStore

    return RemoteStore.connect(url, api_key)


register_backend_factories(backend_for, store_for)
