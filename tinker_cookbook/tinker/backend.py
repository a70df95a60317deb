"""What the API's clients need from whatever serves them: one backend interface of plain requests.

Every operation is a request a wire protocol can carry (a model id, data, a loss name and its config, a path),
never a closure over engine objects, so the same interface has three implementations:

- the in-process engine (``tinker_cookbook.engine.backend.LocalBackend``);
- the HTTP server (``tinker_cookbook.server``), a thin adapter that turns Tinker-protocol requests into these
  calls on whichever backend it serves;
- the remote client (``tinker_cookbook.tinker._remote``), which sends them to a Tinker-protocol server through the
  official ``tinker`` SDK.

This module is public: it is what a backend implements and what the server adapts; ``tinker_cookbook.backends``
chooses the backend for a base URL.

``tinker/`` never imports the engine: ``ServiceClient(base_url=...)`` asks :func:`resolve_backend`, whose factory
is registered by ``tinker_cookbook.backends`` (the one module that knows both the engine and the remote client).

Training requests of one model id run in submission order. Sampler handles are opaque to the clients except for
the three attributes of :class:`SamplerHandle`; each backend has its own handle type (``Backend[H]``) and samples only
the handles it made. Code that gets its backend at run time (the clients, the server) holds a ``Backend[Any]`` and
passes a handle back only to the backend it came from.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tinker_cookbook.tinker import types

if TYPE_CHECKING:
    import torch

    from tinker_cookbook.base.tokenizers import Tokenizer

CustomLossFn = Callable[[list[types.Datum], list["torch.Tensor"]], tuple["torch.Tensor", dict[str, float]]]


class CheckpointStoreAPI(Protocol):
    """Runs and checkpoints under ``tinker://`` paths (what RestClient and the checkpoint CLI operate on)."""

    def get_run(self, run_id: str) -> types.TrainingRun: ...
    def list_runs(self, limit: int = ..., offset: int = ...) -> types.TrainingRunsResponse: ...
    def get_checkpoint(self, tinker_path: str) -> types.Checkpoint: ...
    def list_checkpoints(self, run_id: str) -> types.CheckpointsListResponse: ...
    def list_user_checkpoints(self, limit: int = ..., offset: int = ...) -> types.CheckpointsListResponse: ...
    def weights_info(self, tinker_path: str) -> types.WeightsInfoResponse: ...
    def archive(self, tinker_path: str) -> Path: ...
    def delete_checkpoint(self, tinker_path: str) -> None: ...
    def set_public(self, tinker_path: str, public: bool) -> None: ...
    def set_ttl(self, tinker_path: str, ttl_seconds: int | None) -> None: ...


class SamplerHandle(Protocol):
    """Fixed weights to sample from, as a backend hands them out."""

    @property
    def base_model(self) -> str: ...
    @property
    def model_path(self) -> str | None: ...
    @property
    def tokenizer(self) -> Tokenizer: ...


H = TypeVar("H", bound=SamplerHandle)
"""A backend's own sampler handle type."""


class Backend(Protocol[H]):
    """Training sessions, sampling and checkpoints, as plain requests."""

    # -- service -----------------------------------------------------------------------------------------
    @property
    def store(self) -> CheckpointStoreAPI: ...
    def capabilities(self) -> types.GetServerCapabilitiesResponse: ...
    def model_data(self, base_model: str) -> types.ModelData: ...

    # -- training sessions (one LoRA adapter and its optimizer each, named by run id) ----------------------
    def create_session(self, base_model: str, lora: types.LoraConfig,
                       user_metadata: dict[str, str] | None) -> str: ...
    def create_session_from_state(self, path: str, with_optimizer: bool,
                                  user_metadata: dict[str, str] | None) -> tuple[str, str, types.LoraConfig]: ...
    def forward(self, run_id: str, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> concurrent.futures.Future[types.ForwardBackwardOutput]: ...
    def forward_backward_custom(self, run_id: str, data: list[types.Datum], loss_fn: CustomLossFn
                                ) -> concurrent.futures.Future[types.ForwardBackwardOutput]: ...
    def optim_step(self, run_id: str, adam_params: types.AdamParams
                   ) -> concurrent.futures.Future[types.OptimStepResponse]: ...
    def save(self, run_id: str, kind: types.CheckpointKind, name: str, ttl_seconds: int | None,
             overwrite: bool) -> concurrent.futures.Future[str]: ...
    def load(self, run_id: str, path: str, with_optimizer: bool
             ) -> concurrent.futures.Future[types.LoadWeightsResponse]: ...
    def snapshot(self, run_id: str, name: str | None) -> concurrent.futures.Future[H]: ...
    def close_session(self, run_id: str) -> concurrent.futures.Future[None]: ...
    def release_collected(self, run_id: str) -> None: ...

    # -- sampling ----------------------------------------------------------------------------------------
    def handle_for_path(self, model_path: str) -> H: ...
    def handle_for_base(self, base_model: str) -> H: ...
    def sample(self, handle: H, prompt: types.ModelInput, num_samples: int, params: types.SamplingParams,
               include_prompt_logprobs: bool, topk_prompt_logprobs: int
               ) -> concurrent.futures.Future[types.SampleResponse]: ...


# -- choosing the backend -----------------------------------------------------------------------------------

BackendFactory = Callable[[str | None, str | None], "Backend[Any]"]
"""``factory(base_url, api_key)``: the backend that serves clients created with that base URL."""
StoreFactory = Callable[[str | None, str | None], CheckpointStoreAPI]
"""``factory(base_url, api_key)``: the checkpoint store alone (what a RestClient needs; no model loading)."""

PROVIDER_MODULE = "tinker_cookbook.backends"
"""Imported on first use when no factories are registered yet; it registers the default ones."""

_factories: tuple[BackendFactory, StoreFactory] | None = None
_factories_lock = threading.Lock()


def register_backend_factories(backend: BackendFactory, store: StoreFactory) -> None:
    """Make ``ServiceClient`` and ``RestClient`` use these factories from now on."""
    global _factories
    with _factories_lock:
        _factories = (backend, store)


def _registered() -> tuple[BackendFactory, StoreFactory]:
    if _factories is None:
        # A module name, not an import statement: the contract stays free of the engine, and the provider
        # registers itself when imported.
        importlib.import_module(PROVIDER_MODULE)
    if _factories is None:
        raise RuntimeError(f"{PROVIDER_MODULE} did not register backend factories")
    return _factories


def resolve_backend(base_url: str | None, api_key: str | None = None) -> Backend[Any]:
    """The backend for ``base_url`` (None or "local": the in-process engine; a URL: that server)."""
    return _registered()[0](base_url, api_key)


def resolve_store(base_url: str | None, api_key: str | None = None) -> CheckpointStoreAPI:
    """The checkpoint store for ``base_url``, without starting an engine."""
    return _registered()[1](base_url, api_key)
