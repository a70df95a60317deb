"""The models the OpenAI-compatible routes serve: base models and ``tinker://`` sampler checkpoints, loaded on first
use (``ModelRegistry``), each with its tokenizer and renderers (``ServedModel``)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tinker_cookbook import model_info, renderers
from tinker_cookbook.checkpoint_utils import RENDERER_NAME_METADATA_KEY
from tinker_cookbook.exceptions import ConfigurationError, RendererError
from tinker_cookbook.tinker import SamplingClient, types
from tinker_cookbook.tinker.backend import Backend, SamplerHandle
from tinker_cookbook.tinker.errors import BadRequestError, NotFoundError, TinkerError

TINKER_PATH_PREFIX = "tinker://"
MAX_CACHED_CHECKPOINTS = 8
"""Sampler checkpoints kept loaded; each holds its adapter's weights, so the least recently used goes first."""


@dataclass
class ServedModel:
    """A model the server samples from, with its tokenizer and the renderers built for it so far."""

    name: str
    handle: SamplerHandle
    tokenizer: Any
    base_model: str
    stored_renderer: str | None
    built_renderers: dict[str, renderers.Renderer] = field(default_factory=dict)

    def renderer_name(self, requested: str | None) -> str:
        """The renderer a request gets: the one it names, else the checkpoint's, else the model's default."""
        name = requested or self.stored_renderer
        if name is not None:
            return name
        try:
            return model_info.get_recommended_renderer_name(self.base_model)
        except ConfigurationError as exc:
            raise BadRequestError(
                f"no default renderer for {self.base_model!r}: pass one as the body field 'renderer' "
                f"(one of {renderers.get_registered_renderer_names()})"
            ) from exc

    def renderer(self, requested: str | None) -> renderers.Renderer:
        name = self.renderer_name(requested)
        if name not in self.built_renderers:
            try:
                self.built_renderers[name] = renderers.get_renderer(name, self.tokenizer, model_name=self.base_model)
            except RendererError as exc:
                raise BadRequestError(f"renderer={name!r}: {exc}") from None
        return self.built_renderers[name]


class ModelRegistry:
    """Resolves a request's ``model`` to a loaded model; loads each at most once (checkpoints: a small LRU)."""

    def __init__(self, backend: Backend[Any]) -> None:
        self.backend = backend
        self._base: dict[str, ServedModel] = {}
        self._checkpoints: OrderedDict[str, ServedModel] = OrderedDict()
        self._loading: dict[str, asyncio.Lock] = {}
        self._known_bases: set[str] | None = None

    def base_model_names(self, refresh: bool = False) -> list[str]:
        """The base models the backend can serve (models it can load without the network)."""
        if refresh or self._known_bases is None:
            supported = self.backend.capabilities().supported_models
            self._known_bases = {m.model_name for m in supported if m.model_name}
        return sorted(self._known_bases)

    def loaded_checkpoints(self) -> list[str]:
        return list(self._checkpoints)

    def preload(self, name: str) -> ServedModel:
        """Load ``name`` now, before serving (blocking; for ``serve --model``)."""
        return asyncio.run(self.get(name))

    async def get(self, name: str) -> ServedModel:
        served = self._checkpoints.get(name) or self._base.get(name)
        if served is not None:
            if name in self._checkpoints:
                self._checkpoints.move_to_end(name)
            return served
        lock = self._loading.setdefault(name, asyncio.Lock())
        async with lock:  # concurrent first requests for one model load it once
            served = self._checkpoints.get(name) or self._base.get(name)
            if served is None:
                served = await self._load(name)
        self._loading.pop(name, None)
        return served

    async def _load(self, name: str) -> ServedModel:
        if name.startswith(TINKER_PATH_PREFIX):
            handle = await asyncio.to_thread(self.backend.handle_for_path, name)
            served = self._served(name, handle, self._stored_renderer(name))
            self._checkpoints[name] = served
            while len(self._checkpoints) > MAX_CACHED_CHECKPOINTS:
                self._checkpoints.popitem(last=False)
            return served
        # Only models the backend lists: a remote client must not make the server fetch arbitrary names.
        if name not in self.base_model_names() and name not in self.base_model_names(refresh=True):
            raise NotFoundError(
                f"model={name!r} is not served here; use one of {self.base_model_names()} or a "
                "tinker://RUN/sampler_weights/NAME checkpoint path (GET /v1/models lists them)"
            )
        handle = await asyncio.to_thread(self.backend.handle_for_base, name)
        served = self._served(name, handle, None)
        self._base[name] = served
        return served

    def _served(self, name: str, handle: SamplerHandle, stored_renderer: str | None) -> ServedModel:
        client = SamplingClient(self.backend, handle)  # the public accessors of the opaque handle
        return ServedModel(name=name, handle=handle, tokenizer=client.get_tokenizer(),
                           base_model=client.get_base_model(), stored_renderer=stored_renderer)

    def _stored_renderer(self, tinker_path: str) -> str | None:
        """The renderer the checkpoint's run was trained with, when its metadata records one."""
        try:
            run_id = types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path).training_run_id
            run = self.backend.store.get_run(run_id)
        except (TinkerError, ValueError):
            return None
        return (run.user_metadata or {}).get(RENDERER_NAME_METADATA_KEY)

