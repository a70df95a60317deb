"""The in-process engine behind ``tinker_cookbook.tinker``.

One ``LocalBackend`` per process holds the base models (each loaded once), the training sessions, the
checkpoint store and the sampler. Training requests of all clients run on one worker thread in submission
order, which gives each client the ordering guarantee of the API (and lets ``forward_backward`` and
``optim_step`` be submitted back to back). Sampling runs on the sampler's own thread, batching concurrent
requests.
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from tinker_cookbook.engine import models
from tinker_cookbook.engine.checkpoint_store import CheckpointStore
from tinker_cookbook.engine.training import BaseModel, TrainingSession, read_sampler_adapter
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, InternalServerError, NotFoundError, TinkerError

T = TypeVar("T")


class SamplerHandle:
    """What a sampling client samples from: immutable weights plus the tokenizer and base model name."""

    def __init__(self, base_model: str, weights: Any, tokenizer: Any, model_path: str | None) -> None:
        self.base_model = base_model
        self.weights = weights
        self.tokenizer = tokenizer
        self.model_path = model_path


class LocalBackend:
    _default: LocalBackend | None = None
    _default_lock = threading.Lock()

    def __init__(self, store: CheckpointStore | None = None) -> None:
        self.store = store or CheckpointStore()
        self._bases: dict[str, BaseModel] = {}
        self._sessions: dict[str, TrainingSession] = {}
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-engine")
        self._sampler: Any = None
        self._sampler_lock = threading.Lock()

    @classmethod
    def default(cls) -> LocalBackend:
        """The process-wide engine, so that every client shares the loaded base models."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = LocalBackend()
            return cls._default

    # -- plumbing ---------------------------------------------------------------------------------------

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the engine thread after everything submitted before it."""
        return self._worker.submit(_as_api_error, fn)

    def submit_session(self, run_id: str, fn: Callable[[TrainingSession], T]) -> concurrent.futures.Future[T]:
        return self.submit(lambda: fn(self._session(run_id)))

    def _session(self, run_id: str) -> TrainingSession:
        if run_id not in self._sessions:
            raise NotFoundError(f"no live training client with model_id {run_id!r} in this process")
        return self._sessions[run_id]

    def _base(self, name: str) -> BaseModel:
        if name not in self._bases:
            spec = models.get_model_spec(name)
            self._bases[name] = BaseModel(spec, models.load_model(name, torch.float32))
        return self._bases[name]

    # -- service ----------------------------------------------------------------------------------------

    def capabilities(self) -> types.GetServerCapabilitiesResponse:
        return types.GetServerCapabilitiesResponse(
            supported_models=[
                types.SupportedModel(model_name=s.name, max_context_length=s.max_context_length)
                for s in models.available_models()
            ]
        )

    def create_session(self, base_model: str, lora: types.LoraConfig, user_metadata: dict[str, str] | None) -> str:
        _check_model_name(base_model)
        if lora.rank < 1:
            raise BadRequestError(f"rank={lora.rank} is invalid; the LoRA rank must be a positive integer (e.g. 32)")
        if not (lora.train_attn or lora.train_mlp or lora.train_unembed):
            raise BadRequestError("train_attn, train_mlp and train_unembed are all False; enable at least one")

        def create() -> str:
            base = self._base(base_model)
            run_id = self.store.create_run(base_model, lora, user_metadata)
            self._sessions[run_id] = TrainingSession(run_id, base, lora)
            return run_id

        return self.submit(create).result()

    def create_session_from_state(self, path: str, with_optimizer: bool, user_metadata: dict[str, str] | None
                                  ) -> tuple[str, str, types.LoraConfig]:
        """A new session holding a ``weights/`` checkpoint; returns (run_id, base_model, lora config)."""
        meta = self.store.checkpoint_metadata(path)
        directory = self.store.checkpoint_dir(path, expected_kind="weights")
        lora = types.LoraConfig(
            rank=int(meta["lora_rank"]), train_attn=bool(meta["train_attn"]), train_mlp=bool(meta["train_mlp"]),
            train_unembed=bool(meta["train_unembed"]), seed=0,
        )
        run_id = self.create_session(meta["base_model"], lora, user_metadata)
        try:
            self.submit_session(run_id, lambda s: s.load_state(directory, with_optimizer, path)).result()
        except BaseException:
            self.close_session(run_id)  # a checkpoint that does not load leaves no half-made client behind
            raise
        return run_id, meta["base_model"], lora

    def close_session(self, run_id: str) -> None:
        def close() -> None:
            session = self._sessions.pop(run_id, None)
            if session is not None:
                session.close()

        self.submit(close)

    # -- checkpoints ------------------------------------------------------------------------------------

    def save(self, session: TrainingSession, kind: str, name: str, ttl_seconds: int | None, overwrite: bool = False) -> str:
        writer = session.write_state if kind == "weights" else session.write_adapter
        checkpoint = self.store.write_checkpoint(
            session.run_id, kind, name, writer, session.metadata(), ttl_seconds=ttl_seconds, overwrite=overwrite
        )
        return checkpoint.tinker_path

    def load(self, session: TrainingSession, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        meta = self.store.checkpoint_metadata(path)
        if meta.get("base_model") != session.base.spec.name:
            raise BadRequestError(f"{path} was trained on {meta.get('base_model')!r}, but this client's base model is "
                                  f"{session.base.spec.name!r}; create a client with create_training_client_from_state")
        session.load_state(self.store.checkpoint_dir(path, expected_kind="weights"), with_optimizer, path)
        return types.LoadWeightsResponse(path=path, type="load_weights")

    # -- sampling ---------------------------------------------------------------------------------------

    @property
    def sampler(self) -> Any:
        with self._sampler_lock:
            if self._sampler is None:
                from tinker_cookbook.engine.sampler import SamplerEngine

                self._sampler = SamplerEngine()
            return self._sampler

    def _handle(self, base: BaseModel, adapter_state: dict[str, torch.Tensor] | None,
                adapter_config: dict[str, Any] | None, model_path: str | None) -> SamplerHandle:
        from tinker_cookbook.engine.sampler import SamplingWeights, default_sampling_dtype
        from tinker_cookbook.base.tokenizers import get_tokenizer

        weights = SamplingWeights.build(base.config, base.base_state, adapter_state, adapter_config,
                                        default_sampling_dtype())
        return SamplerHandle(base.spec.name, weights, get_tokenizer(base.spec.tokenizer_name), model_path)

    def snapshot_handle(self, session: TrainingSession, model_path: str | None) -> SamplerHandle:
        """Sampling weights of the session's adapter as it is now (runs on the engine thread, in order)."""
        state = session.base.adapter_state(session.run_id)
        return self._handle(session.base, state, session.base.adapter_config_dict(session.run_id), model_path)

    def handle_for_path(self, model_path: str) -> SamplerHandle:
        directory = self.store.checkpoint_dir(model_path, expected_kind="sampler_weights")
        meta = self.store.checkpoint_metadata(model_path)
        return self.submit(lambda: self._handle_from_dir(meta["base_model"], directory, model_path)).result()

    def _handle_from_dir(self, base_model: str, directory: Path, model_path: str) -> SamplerHandle:
        base = self._base(base_model)
        state, config = read_sampler_adapter(directory, model_path, base)
        return self._handle(base, state, config, model_path)

    def handle_for_base(self, base_model: str) -> SamplerHandle:
        _check_model_name(base_model)
        return self.submit(lambda: self._handle(self._base(base_model), None, None, None)).result()

    def sample(self, handle: SamplerHandle, prompt: types.ModelInput, num_samples: int, params: types.SamplingParams,
               include_prompt_logprobs: bool, topk_prompt_logprobs: int) -> concurrent.futures.Future[types.SampleResponse]:
        return self.sampler.submit(handle.weights, handle.tokenizer, prompt, num_samples, params,
                                   include_prompt_logprobs, topk_prompt_logprobs)


def _check_model_name(base_model: object) -> None:
    if not isinstance(base_model, str) or not base_model:
        raise BadRequestError(f"base_model={base_model!r} is not a model name; pass one of "
                              "get_server_capabilities().supported_models, e.g. 'Qwen/Qwen3-8B'")


def _as_api_error(fn: Callable[[], T]) -> T:
    """Run ``fn``; API errors pass through, anything else is an engine failure: InternalServerError.

    Only explicit validation raises BadRequestError. A stray ValueError, KeyError or TypeError is a bug in the
    engine, not the user's mistake, so it is never relabelled as one; its type is named and it stays chained as
    ``__cause__`` for the traceback.
    """
    try:
        return fn()
    except TinkerError:
        raise
    except Exception as exc:  # noqa: BLE001 - report any engine failure through the request's future
        raise InternalServerError(f"the engine failed: {type(exc).__name__}: {exc}") from exc
