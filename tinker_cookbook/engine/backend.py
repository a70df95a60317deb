"""The in-process engine behind ``tinker_cookbook.tinker``.

One ``LocalBackend`` per process holds the base models (each loaded once), the training sessions, the
checkpoint store and the sampler. Training requests of all clients run on one worker thread in submission
order (``request_queue``: built-in-loss forwards of several sessions share a pass through their base, see
``training.multi_client``). Sampling runs on the sampler's own thread, batching concurrent requests.

Lifetime: ``close()`` stops both threads. At interpreter exit the training requests already submitted still run
(the worker is an ordinary thread that Python joins, so a ``save_state`` queued just before exit completes, as
it would on a server); then exit hooks stop the sampler (its pending requests fail) and close the engine.
"""

from __future__ import annotations

import concurrent.futures
import functools
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from tinker_cookbook.engine import device as engine_devices
from tinker_cookbook.engine import handles, models
from tinker_cookbook.engine.exit_hooks import CloseAtExit
from tinker_cookbook.engine.handles import SamplerHandle
from tinker_cookbook.engine.request_queue import CLOSED_MESSAGE, Queued, RequestQueue, api_outcome
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.engine.store.files import read_sampler_adapter
from tinker_cookbook.engine.training.base_model import BaseModel
from tinker_cookbook.engine.training.custom_loss import CustomLossFn
from tinker_cookbook.engine.training.losses import LOSSES
from tinker_cookbook.engine.training.multi_client import forward_together
from tinker_cookbook.engine.training.session import ForwardRequest, Outcome, TrainingSession
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import (
    BadRequestError,
    NotFoundError,
    RequestFailedError,
    TinkerError,
)

T = TypeVar("T")


class LocalBackend:
    _defaults: ClassVar[dict[str, LocalBackend]] = {}
    _default_lock = threading.Lock()

    def __init__(self, store: CheckpointStore | None = None, device: str | torch.device | None = None) -> None:
        """``device``: where models, training and sampling run (None: ``$TINKER_COOKBOOK_DEVICE``, default auto:
        the GPU when torch sees one, else the CPU); see ``tinker_cookbook.engine.device``."""
        self.device = engine_devices.resolve_device(device)
        self.store = store or CheckpointStore()
        self._bases: dict[str, BaseModel] = {}
        self._sessions: dict[str, TrainingSession] = {}
        self._requests = RequestQueue(lambda: len(self._sessions), self._run_together, self._drop_session)
        self._sampler: Any = None
        self._sampler_lock = threading.Lock()
        self.batched_requests = 0  # requests that ran in a pass shared with other sessions' requests
        _open_backends.add(self)

    @classmethod
    def default(cls) -> LocalBackend:
        """The process-wide engine (one per configured device), so that every client shares the loaded base models."""
        device = str(engine_devices.engine_device())
        with cls._default_lock:
            backend = cls._defaults.get(device)
            if backend is None or backend._closed:
                backend = cls._defaults[device] = LocalBackend(device=device)
            return backend

    # -- plumbing ---------------------------------------------------------------------------------------

    @property
    def _closed(self) -> bool:
        return self._requests.closed

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the engine thread after everything submitted before it."""
        return self._requests.submit(Queued(fn, None))

    def _run_together(self, requests: list[Queued]) -> list[Outcome]:
        """Run built-in-loss forwards of different sessions in one batch; each taken request gets its outcome."""
        outcomes: list[Outcome]
        try:
            sessions, runnable = [], []
            outcomes = [RuntimeError("unset")] * len(requests)
            for i, request in enumerate(requests):
                assert request.run_id is not None and request.forward is not None
                try:
                    sessions.append((self._session(request.run_id), request.forward))
                    runnable.append(i)
                except TinkerError as exc:
                    outcomes[i] = exc
            results, mixed = forward_together(sessions)
            self.batched_requests += mixed
            for i, outcome in zip(runnable, results, strict=True):
                outcomes[i] = outcome
            outcomes = [api_outcome(o) for o in outcomes]
        except BaseException as exc:  # an engine failure outside any one request: every one of them fails
            failure = api_outcome(exc) if isinstance(exc, Exception) else exc
            outcomes = [failure] * len(requests)
        for request, outcome in zip(requests, outcomes, strict=True):
            request.outcome = outcome
        return outcomes

    def submit_session(self, run_id: str, fn: Callable[[TrainingSession], T]) -> concurrent.futures.Future[T]:
        """Run ``fn(session)`` on the engine thread, in order (the implementation of every training request)."""
        return self._requests.submit(Queued(lambda: fn(self._session(run_id)), run_id))

    def _session(self, run_id: str) -> TrainingSession:
        if run_id not in self._sessions:
            raise NotFoundError(f"no live training client with model_id {run_id!r} in this process")
        return self._sessions[run_id]

    def _base(self, name: str) -> BaseModel:
        if name not in self._bases:
            from tinker_cookbook.engine.sampling.weights import default_sampling_dtype

            spec = models.get_model_spec(name)
            compute = engine_devices.base_dtype(self.device)
            model = models.load_model(name, torch.float32)
            if self.device.type != "cpu":
                torch.nn.Module.to(model, self.device)  # in place; PreTrainedModel.to has a narrower stub
            self._bases[name] = BaseModel(spec, model, compute)
            engine_devices.announce(self.device, compute, default_sampling_dtype(self.device))
        return self._bases[name]

    # -- service ----------------------------------------------------------------------------------------

    def capabilities(self) -> types.GetServerCapabilitiesResponse:
        return types.GetServerCapabilitiesResponse(
            supported_models=[
                types.SupportedModel(model_name=s.name, max_context_length=s.max_context_length, trainable=True,
                                     sampleable=True)
                for s in models.available_models()
            ],
            supported_loss_fns=sorted(LOSSES),
        )

    def model_data(self, base_model: str) -> types.ModelData:
        """Architecture and tokenizer of a base model (a registry lookup; loads no weights)."""
        spec = models.get_model_spec(base_model)
        return types.ModelData(arch=spec.arch, model_name=base_model, tokenizer_id=spec.tokenizer_name)

    def create_session(self, base_model: str, lora: types.LoraConfig, user_metadata: dict[str, str] | None) -> str:
        _check_model_name(base_model)
        check_lora_config(lora)

        def create() -> str:
            base = self._base(base_model)
            _check_rank(lora.rank, base)
            run_id = self.store.create_run(base_model, lora, user_metadata)
            try:
                self._sessions[run_id] = TrainingSession(run_id, base, lora)
            except BaseException:
                self.store.discard_new_run(run_id)  # a client that could not be built leaves no run behind
                raise
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
        except Exception:
            # A checkpoint that does not load leaves no half-made client behind, and no run that lists it.
            self.close_session(run_id).result()
            self.store.discard_new_run(run_id)
            raise
        except BaseException:  # interrupted: release the client without waiting
            self.close_session(run_id)
            raise
        return run_id, meta["base_model"], lora

    def close_session(self, run_id: str) -> concurrent.futures.Future[None]:
        """Release a session (its adapter, gradients and Adam state) after the requests queued before this call."""
        if self._closed:  # the sessions went with the engine
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return done
        return self._requests.submit(Queued(lambda: self._drop_session(run_id), run_id))

    def _drop_session(self, run_id: str) -> None:
        session = self._sessions.pop(run_id, None)
        if session is not None:
            with warnings.catch_warnings():
                # peft warns when the deleted adapter was the active one; every request activates its own.
                warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
                session.close()

    def release_collected(self, run_id: str) -> None:
        """Release the session of a garbage-collected training client (its ``weakref.finalize`` callback).

        The collector can run this in any thread, holding any lock, so it takes none: the id goes to the request
        queue's reaper (see ``request_queue``). Never runs torch here, and does nothing once the engine is closed
        or the interpreter is shutting down.
        """
        if self._closed or sys.is_finalizing():
            return
        self._requests.release_collected(run_id)

    def close(self, timeout: float | None = None) -> None:
        """Stop the engine (idempotent).

        Training requests that have not started fail with ``RequestFailedError``; the running one finishes.
        The sampler stops after its current step (waiting at most ``timeout`` seconds) and fails its pending
        requests. Sessions and loaded base models are dropped with the engine.
        """
        self._requests.close()
        _open_backends.discard(self)
        with self._sampler_lock:
            sampler = self._sampler
        if sampler is not None:
            sampler.close(timeout)
        self._sessions.clear()
        self._bases.clear()

    # -- training requests (each runs on the engine thread, after the requests submitted before it) -------

    def forward(self, run_id: str, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> concurrent.futures.Future[types.ForwardBackwardOutput]:
        request = ForwardRequest(data, loss_fn, loss_fn_config, backward)
        run = functools.partial(self._forward_alone, run_id, request)
        return self._requests.submit(Queued(run, run_id, forward=request))

    def _forward_alone(self, run_id: str, request: ForwardRequest) -> types.ForwardBackwardOutput:
        return self._session(run_id).forward(request.data, request.loss_fn, request.loss_fn_config, request.backward)

    def forward_backward_custom(self, run_id: str, data: list[types.Datum], loss_fn: CustomLossFn
                                ) -> concurrent.futures.Future[types.ForwardBackwardOutput]:
        return self.submit_session(run_id, lambda s: s.forward_backward_custom(data, loss_fn))

    def optim_step(self, run_id: str, adam_params: types.AdamParams
                   ) -> concurrent.futures.Future[types.OptimStepResponse]:
        return self.submit_session(run_id, lambda s: s.optim_step(adam_params))

    def save(self, run_id: str, kind: str, name: str, ttl_seconds: int | None,
             overwrite: bool = False) -> concurrent.futures.Future[str]:
        return self.submit_session(run_id, lambda s: s.save_to(self.store, kind, name, ttl_seconds, overwrite))

    def load(self, run_id: str, path: str, with_optimizer: bool
             ) -> concurrent.futures.Future[types.LoadWeightsResponse]:
        return self.submit_session(run_id, lambda s: s.load_from(self.store, path, with_optimizer))

    def snapshot(self, run_id: str, name: str | None) -> concurrent.futures.Future[SamplerHandle]:
        """Sampling weights of the adapter as it is when this request runs; with a name, also saved as a
        ``sampler_weights/`` checkpoint that the handle then names."""
        def take(session: TrainingSession) -> SamplerHandle:
            path = None if name is None else session.save_to(self.store, "sampler_weights", name, None, True)
            return handles.snapshot_handle(session, path)

        return self.submit_session(run_id, take)

    # -- sampling ---------------------------------------------------------------------------------------

    @property
    def sampler(self) -> Any:
        with self._sampler_lock:
            if self._closed:
                raise RequestFailedError(CLOSED_MESSAGE)
            if self._sampler is None:
                from tinker_cookbook.engine.sampling.sampler import SamplerEngine

                self._sampler = SamplerEngine()
            return self._sampler

    def handle_for_path(self, model_path: str) -> SamplerHandle:
        directory = self.store.checkpoint_dir(model_path, expected_kind="sampler_weights")
        meta = self.store.checkpoint_metadata(model_path)
        return self.submit(lambda: self._handle_from_dir(meta["base_model"], directory, model_path)).result()

    def _handle_from_dir(self, base_model: str, directory: Path, model_path: str) -> SamplerHandle:
        base = self._base(base_model)
        state, config = read_sampler_adapter(directory, model_path, base.base_state, base.spec.name)
        return handles.build_handle(base, state, config, model_path)

    def handle_for_base(self, base_model: str) -> SamplerHandle:
        _check_model_name(base_model)
        return self.submit(lambda: handles.build_handle(self._base(base_model), None, None, None)).result()

    def sample(self, handle: SamplerHandle, prompt: types.ModelInput, num_samples: int, params: types.SamplingParams,
               include_prompt_logprobs: bool, topk_prompt_logprobs: int) -> concurrent.futures.Future[types.SampleResponse]:
        return self.sampler.submit(handle.weights, handle.tokenizer, prompt, num_samples, params,
                                   include_prompt_logprobs, topk_prompt_logprobs)


def check_lora_config(lora: types.LoraConfig) -> None:
    """Refuse a LoRA config that no model can train (checked before anything loads)."""
    if lora.rank < 1:
        raise BadRequestError(f"rank={lora.rank} is invalid; the LoRA rank must be a positive integer (e.g. 32)")
    if not (lora.train_attn or lora.train_mlp or lora.train_unembed):
        raise BadRequestError("train_attn, train_mlp and train_unembed are all False; enable at least one")


def _check_rank(rank: int, base: BaseModel) -> None:
    """Refuse a LoRA rank above the model's width: every adapted matrix has a side of at most the width (the
    hidden size), so a larger rank adds parameters and no expressiveness, and a huge one could not be allocated."""
    text_config = getattr(base.config, "text_config", None) or base.config
    width = int(text_config.hidden_size)
    if rank > width:
        raise BadRequestError(
            f"lora_config.rank={rank} is above {base.spec.name}'s hidden size of {width}, the largest rank a LoRA "
            f"adapter of this model can use; pass a rank between 1 and {width} (e.g. 32)"
        )


def _check_model_name(base_model: object) -> None:
    if not isinstance(base_model, str) or not base_model:
        raise BadRequestError(f"base_model={base_model!r} is not a model name; pass one of "
                              "get_server_capabilities().supported_models, e.g. 'Qwen/Qwen3-8B'")


def _mark_closed_at_exit(backend: LocalBackend) -> None:
    """atexit: mark the engine closed, so that clients collected from now on release nothing.

    Python has joined the worker by now (after it ran the requests submitted before exit), and the sampler has
    its own exit hook, so nothing here waits or runs torch.
    """
    backend._requests.close_at_exit()


_open_backends: CloseAtExit[LocalBackend] = CloseAtExit(_mark_closed_at_exit)
