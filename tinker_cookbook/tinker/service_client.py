"""ServiceClient: the entry point that creates training, sampling and rest clients.

Every ``_async`` form runs its sync twin in a thread (model loading, adapter merging and checkpoint reads are
blocking work), so the event loop keeps running while a client is being created.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.backend import Backend, resolve_backend
from tinker_cookbook.tinker.errors import BadRequestError
from tinker_cookbook.tinker.futures import APIFuture
from tinker_cookbook.tinker.rest_client import RestClient
from tinker_cookbook.tinker.sampling_client import SamplingClient, check_sampling_client_options
from tinker_cookbook.tinker.training_client import TrainingClient


class ServiceClient:
    """Connects to the engine that trains and samples.

    ``base_url`` None (or "local"): the in-process engine, shared by all clients of the process. A URL
    (``http://host:port``): a server that speaks the Tinker protocol (``tinker-cookbook serve``, or the hosted
    service), reached through the official ``tinker`` SDK (``pip install 'tinker==0.38.0'``); ``api_key``
    goes to that server. ``project_id`` is accepted for source compatibility and ignored.
    """

    def __init__(self, user_metadata: dict[str, str] | None = None, project_id: str | None = None,
                 base_url: str | None = None, api_key: str | None = None, **kwargs: Any) -> None:
        self._backend: Backend[Any] = resolve_backend(base_url, api_key)
        self.base_url = base_url
        self.user_metadata = user_metadata

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The models that can be loaded on this machine now."""
        return self._backend.capabilities()

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return await asyncio.to_thread(self.get_server_capabilities)

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict[str, str] | None = None, optimizer: Any = None
                                    ) -> TrainingClient:
        """``optimizer``: the SDK's optimizer family config; AdamW (None, or type 'adamw') is the one here."""
        family = optimizer.get("type") if isinstance(optimizer, dict) else getattr(optimizer, "type", "adamw")
        if family != "adamw":
            raise BadRequestError(f"optimizer={optimizer!r}: only AdamW is supported here; omit optimizer= (or pass "
                                  "the adamw config) and step with AdamParams")
        try:
            lora = types.LoraConfig(rank=rank, seed=seed, train_mlp=train_mlp, train_attn=train_attn,
                                    train_unembed=train_unembed)
        except ValidationError as exc:
            raise BadRequestError(f"create_lora_training_client: {types.validation_summary(exc)}; rank and seed are "
                                  "integers, train_* are booleans") from None
        run_id = self._backend.create_session(base_model, lora, user_metadata or self.user_metadata)
        return TrainingClient(self._backend, run_id, base_model, lora)

    async def create_lora_training_client_async(self, base_model: str, rank: int = 32, seed: int | None = None,
                                                train_mlp: bool = True, train_attn: bool = True,
                                                train_unembed: bool = True,
                                                user_metadata: dict[str, str] | None = None,
                                                optimizer: Any = None) -> TrainingClient:
        # If the caller is cancelled meanwhile, the thread still builds the client, and collecting it frees the
        # session: nothing leaks.
        return await asyncio.to_thread(self.create_lora_training_client, base_model, rank, seed, train_mlp,
                                       train_attn, train_unembed, user_metadata, optimizer)

    def _from_state(self, path: str, with_optimizer: bool, user_metadata: dict[str, str] | None) -> TrainingClient:
        run_id, base_model, lora = self._backend.create_session_from_state(
            path, with_optimizer, user_metadata or self.user_metadata)
        return TrainingClient(self._backend, run_id, base_model, lora)

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict[str, str] | None = None,
                                          weights_access_token: str | None = None) -> TrainingClient:
        """A new training client with the weights of a ``weights/`` checkpoint and a fresh optimizer."""
        return self._from_state(path, False, user_metadata)

    async def create_training_client_from_state_async(self, path: str, base_model: str | None = None,
                                                      user_metadata: dict[str, str] | None = None,
                                                      weights_access_token: str | None = None) -> TrainingClient:
        return await asyncio.to_thread(self._from_state, path, False, user_metadata)

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None,
                                                         user_metadata: dict[str, str] | None = None,
                                                         weights_access_token: str | None = None) -> TrainingClient:
        """A new training client with the weights and Adam state of a checkpoint, to resume training exactly."""
        return self._from_state(path, True, user_metadata)

    async def create_training_client_from_state_with_optimizer_async(
        self, path: str, base_model: str | None = None, user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> TrainingClient:
        return await asyncio.to_thread(self._from_state, path, True, user_metadata)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config: Any = None, record_stability_info: bool = False) -> SamplingClient:
        """Sample from a ``sampler_weights/`` checkpoint (model_path) or from a base model."""
        check_sampling_client_options(record_stability_info)
        if (model_path is None) == (base_model is None):
            raise BadRequestError("create_sampling_client needs exactly one of model_path= or base_model=")
        if model_path is not None:
            return SamplingClient(self._backend, self._backend.handle_for_path(model_path))
        return SamplingClient(self._backend, self._backend.handle_for_base(base_model or ""))

    async def create_sampling_client_async(self, model_path: str | None = None, base_model: str | None = None,
                                           retry_config: Any = None, record_stability_info: bool = False
                                           ) -> SamplingClient:
        return await asyncio.to_thread(self.create_sampling_client, model_path, base_model, None,
                                       record_stability_info)

    def create_rest_client(self) -> RestClient:
        """Runs and checkpoints of the same engine or server."""
        return RestClient(self._backend.store)


__all__ = ["APIFuture", "ServiceClient"]
