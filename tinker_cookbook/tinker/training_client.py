"""TrainingClient: one LoRA adapter being trained (the same methods as the official SDK).

Every method has a sync form returning an ``APIFuture`` and an ``_async`` form. The async forms are two-stage:
``fut = await tc.forward_backward_async(...)`` returns once the request is submitted (ordered after earlier ones),
``await fut`` gives the result. Requests of one client run in submission order. No ``_async`` form blocks the
event loop: waiting and file work happen in a thread or on the engine's future.

A client holds its adapter, gradients and Adam state in the engine until ``close()`` (or ``with`` block exit)
or until it is garbage collected; a snapshot ``SamplingClient`` keeps working after its training client is gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

from tinker_cookbook.tinker import provenance, types
from tinker_cookbook.tinker.backend import CustomLossFn
from tinker_cookbook.tinker.errors import BadRequestError
from tinker_cookbook.tinker.futures import APIFuture
from tinker_cookbook.tinker.sampling_client import check_sampling_client_options

if TYPE_CHECKING:
    from tinker_cookbook.tinker.backend import Backend
    from tinker_cookbook.tinker.sampling_client import SamplingClient

__all__ = ["CustomLossFn", "TrainingClient"]

T = TypeVar("T")


def _copy_data(data: Any) -> Any:
    """A copy of a list of data, so that later changes by the caller do not reach the queued request; anything
    else goes to the engine as it is, which rejects it with a message naming it."""
    return list(data) if isinstance(data, (list, tuple)) else data


def _check_loss_type_input(loss_type_input: Any) -> None:
    # The custom loss always receives logprobs: the SDK accepts only that value (None means the same).
    if loss_type_input not in (None, "logprobs"):
        raise BadRequestError(f"loss_type_input={loss_type_input!r} is not supported; the custom loss always "
                              "receives logprobs, so pass loss_type_input='logprobs' or omit it")


class TrainingClient:
    def __init__(self, backend: Backend[Any], model_id: str, base_model: str, lora_config: types.LoraConfig) -> None:
        self._backend = backend
        self.model_id = model_id
        self._base_model = base_model
        self._lora = lora_config
        self._ephemeral_count = 0
        self._closed = False
        # Release the session when this client is collected, but never at interpreter exit: torch must not run
        # on a dying interpreter, and the engine's exit hook takes care of it then.
        self._release = weakref.finalize(self, backend.release_collected, model_id)
        self._release.atexit = False

    def _check_open(self) -> None:
        if self._closed:
            raise BadRequestError(
                f"TrainingClient(model_id={self.model_id!r}) is closed: its adapter and optimizer state were "
                "released. Create a new training client (from a save_state checkpoint to continue training)"
            )

    def _submit(self, request: Callable[[], concurrent.futures.Future[T]]) -> APIFuture[T]:
        """Send one request to the backend (after the earlier ones of this client)."""
        self._check_open()
        return APIFuture(request())

    # -- lifetime ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the adapter's weights, gradients and Adam state once the requests already submitted have run.

        Waits for that; idempotent. Save a checkpoint first to keep the weights. Afterwards every method raises
        ``BadRequestError``; sampling clients made from this client keep working.
        """
        if self._closed:
            return
        self._closed = True
        self._release.detach()
        self._backend.close_session(self.model_id).result()

    async def close_async(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- training ---------------------------------------------------------------------------------------

    def forward(self, data: list[types.Datum], loss_fn: types.LossFnType,
                loss_fn_config: dict[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-token logprobs without gradients."""
        return self._forward(data, loss_fn, loss_fn_config, backward=False)

    async def forward_async(self, data: list[types.Datum], loss_fn: types.LossFnType,
                            loss_fn_config: dict[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    def forward_backward(self, data: list[types.Datum], loss_fn: types.LossFnType,
                         loss_fn_config: dict[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss, logprobs, and gradients, which accumulate until ``optim_step``."""
        return self._forward(data, loss_fn, loss_fn_config, backward=True)

    def _forward(self, data: Any, loss_fn: types.LossFnType, loss_fn_config: dict[str, float] | None,
                 backward: bool) -> APIFuture[types.ForwardBackwardOutput]:
        batch = _copy_data(data)
        self._check_open()
        try:
            # Provenance spans must name sequences this process's sampling clients returned.
            provenance.LOCAL.check(batch)
        except BadRequestError as exc:
            return APIFuture.failed(exc)
        return self._submit(lambda: self._backend.forward(self.model_id, batch, loss_fn, loss_fn_config, backward))

    async def forward_backward_async(self, data: list[types.Datum], loss_fn: types.LossFnType,
                                     loss_fn_config: dict[str, float] | None = None
                                     ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: CustomLossFn, *,
                                loss_type_input: Literal["logprobs"] | None = None
                                ) -> APIFuture[types.ForwardBackwardOutput]:
        """Gradients of an arbitrary differentiable loss of the per-datum logprob tensors.

        ``loss_fn(data, logprobs)`` gets one logprob tensor per datum, shaped like that datum's ``target_tokens``
        (``[n]``, or ``[n, k]`` for k candidate tokens per position), and returns ``(scalar loss, metrics)``.
        ``loss_type_input`` is the SDK's (deprecated) keyword naming what the loss receives; the only value is
        ``"logprobs"``, which is also what None means.
        """
        _check_loss_type_input(loss_type_input)
        batch = _copy_data(data)
        return self._submit(lambda: self._backend.forward_backward_custom(self.model_id, batch, loss_fn))

    async def forward_backward_custom_async(self, data: list[types.Datum], loss_fn: CustomLossFn, *,
                                            loss_type_input: Literal["logprobs"] | None = None
                                            ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward_custom(data, loss_fn, loss_type_input=loss_type_input)

    def optim_step(self, optim_params: types.AdamParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        """One AdamW step on the accumulated gradients, which are then cleared. ``adam_params=`` is the SDK's
        older keyword for the same argument."""
        if optim_params is not None and adam_params is not None:
            return APIFuture.failed(BadRequestError("pass optim_params or adam_params, not both"))
        # None goes on as it is: the engine's check names it (adam_params=None is a NoneType, ...).
        params: Any = optim_params if optim_params is not None else adam_params
        return self._submit(lambda: self._backend.optim_step(self.model_id, params))

    async def optim_step_async(self, optim_params: types.AdamParams | None = None, *,
                               adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)

    # -- checkpoints ------------------------------------------------------------------------------------

    def save_state(self, name: str, ttl_seconds: int | None = None,
                   overwrite: bool = False) -> APIFuture[types.SaveWeightsResponse]:
        """Save weights and optimizer state to ``tinker://<model_id>/weights/<name>``."""
        return self._submit(lambda: self._backend.save(self.model_id, "weights", name, ttl_seconds, overwrite)).map(
            lambda path: types.SaveWeightsResponse(path=path, type="save_weights"))

    async def save_state_async(self, name: str, ttl_seconds: int | None = None,
                               overwrite: bool = False) -> APIFuture[types.SaveWeightsResponse]:
        return self.save_state(name, ttl_seconds, overwrite)

    def load_state(self, path: str, weights_access_token: str | None = None) -> APIFuture[types.LoadWeightsResponse]:
        """Load weights from a ``weights/`` checkpoint; the optimizer starts fresh."""
        return self._submit(lambda: self._backend.load(self.model_id, path, False))

    async def load_state_async(self, path: str, weights_access_token: str | None = None
                               ) -> APIFuture[types.LoadWeightsResponse]:
        return self.load_state(path)

    def load_state_with_optimizer(self, path: str, weights_access_token: str | None = None
                                  ) -> APIFuture[types.LoadWeightsResponse]:
        """Load weights and Adam state from a ``weights/`` checkpoint, to resume training exactly."""
        return self._submit(lambda: self._backend.load(self.model_id, path, True))

    async def load_state_with_optimizer_async(self, path: str, weights_access_token: str | None = None
                                              ) -> APIFuture[types.LoadWeightsResponse]:
        return self.load_state_with_optimizer(path)

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None
                                 ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Save the adapter (PEFT format) to ``tinker://<model_id>/sampler_weights/<name>``."""
        return self._submit(
            lambda: self._backend.save(self.model_id, "sampler_weights", name, ttl_seconds, True)
        ).map(lambda path: types.SaveWeightsForSamplerResponse(path=path, type="save_weights_for_sampler"))

    async def save_weights_for_sampler_async(self, name: str, ttl_seconds: int | None = None
                                             ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name, ttl_seconds)

    def save_weights_and_get_sampling_client(self, name: str | None = None, retry_config: Any = None,
                                             record_stability_info: bool = False, kind: str = "snapshot"
                                             ) -> SamplingClient:
        """A sampling client on a snapshot of the current weights (later training does not change it)."""
        check_sampling_client_options(record_stability_info, kind)
        return self._snapshot_future(name).result()

    async def save_weights_and_get_sampling_client_async(self, name: str | None = None, retry_config: Any = None,
                                                         record_stability_info: bool = False,
                                                         kind: str = "snapshot") -> SamplingClient:
        check_sampling_client_options(record_stability_info, kind)
        return await self._snapshot_future(name)

    def _snapshot_future(self, name: str | None) -> APIFuture[SamplingClient]:
        from tinker_cookbook.tinker.sampling_client import SamplingClient

        return self._submit(lambda: self._backend.snapshot(self.model_id, name)).map(
            lambda handle: SamplingClient(self._backend, handle))

    def create_sampling_client(self, model_path: str, retry_config: Any = None,
                               record_stability_info: bool = False) -> SamplingClient:
        from tinker_cookbook.tinker.sampling_client import SamplingClient

        check_sampling_client_options(record_stability_info)
        self._check_open()
        return SamplingClient(self._backend, self._backend.handle_for_path(model_path))

    async def create_sampling_client_async(self, model_path: str, retry_config: Any = None,
                                           record_stability_info: bool = False) -> SamplingClient:
        # Reads the checkpoint and merges the adapter: in a thread, so the event loop keeps running.
        return await asyncio.to_thread(self.create_sampling_client, model_path, None, record_stability_info)

    # -- info -------------------------------------------------------------------------------------------

    def get_info(self) -> types.GetInfoResponse:
        self._check_open()
        return types.GetInfoResponse(
            type="get_info", model_id=self.model_id, is_lora=True, lora_rank=self._lora.rank,
            model_name=self._base_model, model_data=self._backend.model_data(self._base_model),
        )

    async def get_info_async(self) -> types.GetInfoResponse:
        # The model registry may read the Hugging Face cache (or ask the hub once): in a thread.
        return await asyncio.to_thread(self.get_info)

    def get_tokenizer(self) -> Any:
        from tinker_cookbook.base.tokenizers import get_tokenizer  # cached per name

        return get_tokenizer(self.get_info().model_data.tokenizer_id or self._base_model)

    def __repr__(self) -> str:
        closed = ", closed" if self._closed else ""
        return (f"TrainingClient(model_id={self.model_id!r}, base_model={self._base_model!r}, "
                f"rank={self._lora.rank}{closed})")
