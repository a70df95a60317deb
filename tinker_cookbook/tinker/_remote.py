"""The remote backend: the same ``Backend`` operations, sent to a Tinker-protocol server by the official SDK.

``ServiceClient(base_url="http://host:port")`` (and every loop and recipe given ``base_url=...``) lands here: this
project's clients keep their interface, and each operation becomes one call of the official ``tinker`` SDK's
clients, with the data converted between this project's types and the SDK's at the boundary. The SDK is an
optional dependency (``pip install 'tinker==0.38.0'``, the ``remote`` extra), imported only when a remote client is created.

Errors come back as this project's error classes: an HTTP status maps to the class of the same name, and a failed
request keeps the class the server named in its message (``NotFoundError: ...``) when it is one of ours.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from tinker_cookbook.base.hosts import is_loopback
from tinker_cookbook.tinker import _drift, errors, types
from tinker_cookbook.tinker.backend import CustomLossFn
from tinker_cookbook.tinker.futures import then

T = TypeVar("T")
U = TypeVar("U")
logger = logging.getLogger(__name__)

# The SDK itself, pinned as the `remote` extra pins it: a hint that names this project's extra would resolve to the
# official cookbook on a package index, and quoted so that zsh does not expand the brackets of an extra.
INSTALL_HINT = "pip install 'tinker==0.38.0' (or, in a checkout: pip install -e '.[remote]')"
LOOPBACK_API_KEY = "tml-local-no-key"
"""Sent to a loopback server when no key is given: the SDK refuses to start without a ``tml-`` key, and a server
on 127.0.0.1 that was started without ``--api-key`` checks none."""


def import_sdk() -> Any:
    """The official ``tinker`` SDK module, or one clear error saying how to install it."""
    try:
        import tinker as sdk  # the official SDK (a top-level package; this project's API is tinker_cookbook.tinker)
    except ImportError as exc:
        raise errors.BadRequestError(
            f"base_url names a remote Tinker server, which is reached through the official tinker SDK, and it is "
            f"not installed ({exc}); install it with `{INSTALL_HINT}`, or omit base_url to use the local engine"
        ) from None
    if not hasattr(sdk, "ServiceClient"):
        raise errors.BadRequestError(
            f"the module named 'tinker' ({getattr(sdk, '__file__', '?')}) is not the official tinker SDK; "
            f"install it with `{INSTALL_HINT}`")
    return sdk


def resolve_api_key(base_url: str, api_key: str | None) -> str | None:
    """The key to send: the given one, else $TINKER_API_KEY, else (loopback only) a placeholder."""
    key = api_key or os.environ.get("TINKER_API_KEY")
    if key is None and is_loopback(urlparse(base_url).hostname or ""):
        return LOOPBACK_API_KEY
    return key


# -- errors ---------------------------------------------------------------------------------------------------

_BY_STATUS: dict[int, type[errors.APIStatusError]] = {
    400: errors.BadRequestError, 401: errors.AuthenticationError, 402: errors.BillingError,
    403: errors.PermissionDeniedError, 404: errors.NotFoundError, 409: errors.ConflictError,
    422: errors.UnprocessableEntityError, 429: errors.RateLimitError,
}
_OUR_CLASS = re.compile(r"Request failed: (?P<cls>[A-Za-z]+Error): (?P<msg>.*?)(?: for self\.request_id=.*)?$", re.S)


def translate_error(exc: BaseException) -> BaseException:
    """This project's error class for an SDK exception (anything else passes through unchanged)."""
    sdk = import_sdk()
    if isinstance(exc, errors.TinkerError):
        return exc
    message = str(exc)
    if isinstance(exc, sdk.RequestFailedError):
        match = _OUR_CLASS.match(message)
        if match is not None:
            cls = getattr(errors, match["cls"], None)
            if isinstance(cls, type) and issubclass(cls, errors.TinkerError):
                return cls(match["msg"])
        category = str(getattr(exc, "category", "")).lower()
        return (errors.BadRequestError if category.endswith("user") else errors.RequestFailedError)(message)
    if isinstance(exc, sdk.APIStatusError):
        body = getattr(exc, "body", None)
        detail = body.get("detail") if isinstance(body, dict) else None
        status = int(getattr(exc, "status_code", 500))
        cls = _BY_STATUS.get(status, errors.InternalServerError if status >= 500 else errors.APIStatusError)
        return cls(str(detail) if detail else message)
    if isinstance(exc, sdk.APITimeoutError):
        return errors.APITimeoutError(message)
    if isinstance(exc, sdk.APIConnectionError):
        return errors.APIConnectionError(message)
    if isinstance(exc, sdk.TinkerError):  # the SDK's base class: its untyped errors (options, configuration)
        return errors.APIError(message)
    return exc


def connect(base_url: str, key: str | None, make: Callable[[], T]) -> T:
    """An SDK client for ``base_url`` from ``make()``; its errors as this project's, naming the URL (and, when no
    key was found, the key that is missing)."""
    sdk = import_sdk()
    try:
        return make()
    except Exception as exc:
        if key is None and type(exc) is sdk.TinkerError:  # the SDK's "api_key client option must be set"
            raise errors.AuthenticationError(
                f"base_url={base_url!r} is not on this machine and no API key was found: pass "
                "ServiceClient(base_url=..., api_key='tml-...'), set TINKER_API_KEY, or store a key with "
                "`tinker auth login` (the server's key, e.g. the one `tinker-cookbook serve` printed)"
            ) from exc
        if _drift.lacks_client_config(exc):
            raise _drift.client_config_drift_error(base_url) from exc
        translated = translate_error(exc)
        if translated is exc:
            raise
        raise type(translated)(f"connecting to {base_url}: {translated}") from exc


def call(fn: Callable[[], T]) -> T:
    """Run an SDK call now, with its errors translated."""
    try:
        return fn()
    except Exception as exc:
        translated = translate_error(exc)
        if translated is exc:
            raise
        raise translated from exc


def adapt(future: concurrent.futures.Future[T], convert: Callable[[T], U]) -> concurrent.futures.Future[U]:
    """A future of ``convert(result)`` with the SDK's errors translated."""
    return then(future, convert, translate_error)


def _sdk_future(value: Any) -> concurrent.futures.Future[Any]:
    """The concurrent future behind an SDK future."""
    return value.future()


def wait(value: Any) -> Any:
    """The result of an SDK future, waiting for it.

    This project's synchronous methods block by contract, also when async code calls them (as the loops do for
    client creation, exactly as with the in-process engine); the SDK's own ``result()`` would log a warning with a
    stack trace each time, so the wait goes through the future's concurrent twin instead.
    """
    return _sdk_future(value).result()


# -- converting data ------------------------------------------------------------------------------------------

def to_sdk_model_input(sdk: Any, model_input: types.ModelInput) -> Any:
    chunks: list[Any] = []
    for chunk in model_input.chunks:
        if isinstance(chunk, types.EncodedTextChunk):
            chunks.append(sdk.types.EncodedTextChunk(tokens=list(chunk.tokens)))
        elif isinstance(chunk, types.ImageChunk):
            chunks.append(sdk.types.ImageChunk(data=chunk.data, format=chunk.format,
                                               expected_tokens=chunk.expected_tokens))
        else:
            raise errors.BadRequestError(f"{type(chunk).__name__} chunks cannot be sent to a remote server; "
                                         "send the image itself as an ImageChunk")
    return sdk.types.ModelInput(chunks=chunks)


def to_sdk_tensor(sdk: Any, td: types.TensorData) -> Any:
    return sdk.types.TensorData(data=list(td.data), dtype=td.dtype, shape=list(td.shape) if td.shape else None)


def _to_sdk_spans(sdk: Any, spans: list[Any] | None) -> list[Any] | None:
    if spans is None:
        return None
    kinds = {"prompt": sdk.types.PromptProvenanceSpan, "sampled": sdk.types.SampledProvenanceSpan}
    return [kinds[s.type](sequence_id=s.sequence_id, offset=s.offset, length=s.length) for s in spans]


def to_sdk_datum(sdk: Any, datum: types.Datum) -> Any:
    return sdk.types.Datum(
        model_input=to_sdk_model_input(sdk, datum.model_input),
        loss_fn_inputs={name: to_sdk_tensor(sdk, td) for name, td in datum.loss_fn_inputs.items()},
        model_input_spans=_to_sdk_spans(sdk, datum.model_input_spans),
        loss_fn_input_spans=_to_sdk_spans(sdk, datum.loss_fn_input_spans),
    )


def to_sdk_data(sdk: Any, data: Any) -> list[Any]:
    if not isinstance(data, list | tuple) or not all(isinstance(d, types.Datum) for d in data):
        raise errors.BadRequestError("data must be a list of tinker_cookbook.tinker.types.Datum")
    return [to_sdk_datum(sdk, d) for d in data]


def from_sdk_tensor(td: Any) -> types.TensorData:
    return types.TensorData(data=td.data, dtype=td.dtype, shape=list(td.shape) if td.shape is not None else None)


def from_sdk_forward_output(out: Any) -> types.ForwardBackwardOutput:
    return types.ForwardBackwardOutput(
        loss_fn_output_type=out.loss_fn_output_type,
        loss_fn_outputs=[{name: from_sdk_tensor(td) for name, td in item.items()} for item in out.loss_fn_outputs],
        metrics=dict(out.metrics),
    )


def from_sdk_sample_response(response: Any) -> types.SampleResponse:
    return types.SampleResponse(
        sequences=[types.SampledSequence(stop_reason=seq.stop_reason, tokens=list(seq.tokens),
                                         logprobs=None if seq.logprobs is None else list(seq.logprobs),
                                         sequence_id=getattr(seq, "sequence_id", None) or None)
                   for seq in response.sequences],
        prompt_logprobs=response.prompt_logprobs,
        topk_prompt_logprobs=response.topk_prompt_logprobs,
    )


def to_sdk_sampling_params(sdk: Any, params: types.SamplingParams) -> Any:
    return sdk.types.SamplingParams(**params.model_dump(exclude_none=True))


def _pydantic(model: type[T], value: Any) -> T:
    return model.model_validate(value.model_dump())  # type: ignore[attr-defined]


# -- sampler handles ------------------------------------------------------------------------------------------

@dataclass
class RemoteSamplerHandle:
    client: Any
    base_model: str
    model_path: str | None
    _tokenizer: Any = field(default=None, repr=False)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tinker_cookbook.base.tokenizers import get_tokenizer

            self._tokenizer = get_tokenizer(self.base_model)
        return self._tokenizer


# -- the checkpoint store of a remote server ------------------------------------------------------------------

class RemoteStore:
    """``CheckpointStoreAPI`` over the SDK's RestClient."""

    def __init__(self, rest_client: Any) -> None:
        self._rest = rest_client

    @classmethod
    def connect(cls, base_url: str, api_key: str | None) -> RemoteStore:
        sdk = import_sdk()
        key = resolve_api_key(base_url, api_key)
        return cls(connect(base_url, key, lambda: sdk.RestClient(base_url=base_url, api_key=key)))

    def get_run(self, run_id: str) -> types.TrainingRun:
        return _pydantic(types.TrainingRun, call(lambda: wait(self._rest.get_training_run(run_id))))

    def list_runs(self, limit: int = 20, offset: int = 0) -> types.TrainingRunsResponse:
        return _pydantic(types.TrainingRunsResponse,
                         call(lambda: wait(self._rest.list_training_runs(limit=limit, offset=offset))))

    def list_checkpoints(self, run_id: str) -> types.CheckpointsListResponse:
        return _pydantic(types.CheckpointsListResponse, call(lambda: wait(self._rest.list_checkpoints(run_id))))

    def list_user_checkpoints(self, limit: int = 100, offset: int = 0) -> types.CheckpointsListResponse:
        return _pydantic(types.CheckpointsListResponse,
                         call(lambda: wait(self._rest.list_user_checkpoints(limit=limit, offset=offset))))

    def get_checkpoint(self, tinker_path: str) -> types.Checkpoint:
        parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
        for checkpoint in self.list_checkpoints(parsed.training_run_id).checkpoints:
            if checkpoint.tinker_path == tinker_path:
                return checkpoint
        raise errors.NotFoundError(f"no checkpoint {tinker_path!r} on the server")

    def weights_info(self, tinker_path: str) -> types.WeightsInfoResponse:
        return _pydantic(types.WeightsInfoResponse,
                         call(lambda: wait(self._rest.get_weights_info_by_tinker_path(tinker_path))))

    def archive(self, tinker_path: str) -> Path:
        raise errors.BadRequestError(f"{tinker_path}: archives of a remote server's checkpoints are not available "
                                     "through this client; download them on the server")

    def delete_checkpoint(self, tinker_path: str) -> None:
        call(lambda: wait(self._rest.delete_checkpoint_from_tinker_path(tinker_path)))

    def set_public(self, tinker_path: str, public: bool) -> None:
        if public:
            call(lambda: wait(self._rest.publish_checkpoint_from_tinker_path(tinker_path)))
        else:
            call(lambda: wait(self._rest.unpublish_checkpoint_from_tinker_path(tinker_path)))

    def set_ttl(self, tinker_path: str, ttl_seconds: int | None) -> None:
        call(lambda: wait(self._rest.set_checkpoint_ttl_from_tinker_path(tinker_path, ttl_seconds)))


# -- the backend ----------------------------------------------------------------------------------------------

class RemoteBackend:
    """``Backend`` over the SDK's ServiceClient: one SDK session per instance (one per ``ServiceClient``)."""

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self._sdk = sdk = import_sdk()
        self.base_url = base_url
        key = resolve_api_key(base_url, api_key)
        self._service = connect(base_url, key, lambda: sdk.ServiceClient(base_url=base_url, api_key=key))
        self.store = RemoteStore(connect(base_url, key, lambda: sdk.RestClient(base_url=base_url, api_key=key)))
        self._clients: dict[str, Any] = {}
        self._bases: dict[str, str] = {}  # run id -> base model
        self._model_data: dict[str, types.ModelData] = {}
        self._lock = threading.Lock()

    # -- service -------------------------------------------------------------------------------------------
    def capabilities(self) -> types.GetServerCapabilitiesResponse:
        rest = self.store._rest
        return _pydantic(types.GetServerCapabilitiesResponse, call(lambda: wait(rest.get_server_capabilities())))

    def model_data(self, base_model: str) -> types.ModelData:
        with self._lock:
            known = self._model_data.get(base_model)
        return known or types.ModelData(model_name=base_model, tokenizer_id=base_model)

    # -- training sessions ---------------------------------------------------------------------------------
    def _adopt(self, client: Any) -> tuple[str, types.GetInfoResponse]:
        info = _pydantic(types.GetInfoResponse, call(client.get_info))
        base_model = info.model_name or info.model_data.model_name or ""
        with self._lock:
            self._clients[client.model_id] = client
            self._bases[client.model_id] = base_model
            if info.model_name:
                self._model_data[info.model_name] = info.model_data
        return client.model_id, info

    def _client(self, run_id: str) -> Any:
        with self._lock:
            client = self._clients.get(run_id)
        if client is None:
            raise errors.NotFoundError(f"no live training client with model_id {run_id!r} in this process")
        return client

    def create_session(self, base_model: str, lora: types.LoraConfig, user_metadata: dict[str, str] | None) -> str:
        client = call(lambda: wait(self._service.create_lora_training_client(
            base_model=base_model, rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp,
            train_attn=lora.train_attn, train_unembed=lora.train_unembed, user_metadata=user_metadata)))
        return self._adopt(client)[0]

    def create_session_from_state(self, path: str, with_optimizer: bool, user_metadata: dict[str, str] | None
                                  ) -> tuple[str, str, types.LoraConfig]:
        known = self._checkpoint_config(path)
        create = (self._service.create_training_client_from_state_with_optimizer if with_optimizer
                  else self._service.create_training_client_from_state)
        try:
            client = call(lambda: wait(create(path, user_metadata=user_metadata)))
        except errors.BadRequestError as exc:
            if not _drift.needs_model_id(exc):
                raise
            # An older server: the same client, made the older way (create, then load into its model_id).
            if known is None:
                raise _drift.resume_drift_error(self.base_url, path, exc) from exc
            try:
                run_id = self.create_session(known[0], known[1], user_metadata)
                with warnings.catch_warnings():  # load_state is deprecated in the SDK, and the only way here
                    warnings.simplefilter("ignore", FutureWarning)
                    self.load(run_id, path, with_optimizer).result()
            except errors.TinkerError as failed:
                raise _drift.resume_drift_error(self.base_url, path, failed) from failed
            logger.warning("%s", _drift.resume_fallback_note(self.base_url))
            return run_id, known[0], known[1]
        run_id, info = self._adopt(client)
        if known is None:
            known = (info.model_name or "", types.LoraConfig(rank=info.lora_rank or 32))
        return run_id, known[0], known[1]

    def _checkpoint_config(self, path: str) -> tuple[str, types.LoraConfig] | None:
        """The base model and LoRA config a ``weights/`` checkpoint was trained with: from the server's
        ``weights_info``, else (an older server has no such route) from its training run; None if neither says."""
        try:
            weights = self.store.weights_info(path)
            return weights.base_model, types.LoraConfig(
                rank=weights.lora_rank or 32, train_mlp=weights.train_mlp is not False,
                train_attn=weights.train_attn is not False, train_unembed=weights.train_unembed is not False)
        except errors.TinkerError:
            pass
        try:
            run = self.store.get_run(types.ParsedCheckpointTinkerPath.from_tinker_path(path).training_run_id)
        except (errors.TinkerError, ValueError):
            return None
        return run.base_model, types.LoraConfig(rank=run.lora_rank or 32)

    def forward(self, run_id: str, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> concurrent.futures.Future[types.ForwardBackwardOutput]:
        client = self._client(run_id)
        sdk_data = to_sdk_data(self._sdk, data)
        method = client.forward_backward if backward else client.forward
        return then(_sdk_future(call(lambda: method(sdk_data, loss_fn, loss_fn_config))), from_sdk_forward_output,
                    self._result_error)

    def forward_backward_custom(self, run_id: str, data: list[types.Datum], loss_fn: CustomLossFn
                                ) -> concurrent.futures.Future[types.ForwardBackwardOutput]:
        client = self._client(run_id)
        sdk_data = to_sdk_data(self._sdk, data)

        # The SDK runs the loss on its own Datum objects; the caller's loss reads this project's, so it gets those.
        def on_our_data(_sdk_data: Any, logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
            return loss_fn(list(data), logprobs)

        return then(_sdk_future(call(lambda: client.forward_backward_custom(sdk_data, on_our_data))),
                    from_sdk_forward_output, self._result_error)

    def optim_step(self, run_id: str, adam_params: types.AdamParams
                   ) -> concurrent.futures.Future[types.OptimStepResponse]:
        client = self._client(run_id)
        params = self._sdk.types.AdamParams(**adam_params.model_dump())
        return adapt(_sdk_future(call(lambda: client.optim_step(params))),
                     lambda r: types.OptimStepResponse(metrics=r.metrics))

    def save(self, run_id: str, kind: types.CheckpointKind, name: str, ttl_seconds: int | None,
             overwrite: bool = False) -> concurrent.futures.Future[str]:
        client = self._client(run_id)
        if kind == "weights":
            sent = call(lambda: client.save_state(name, ttl_seconds=ttl_seconds, overwrite=overwrite))
        else:
            sent = call(lambda: client.save_weights_for_sampler(name, ttl_seconds=ttl_seconds))
        return adapt(_sdk_future(sent), lambda r: str(r.path))

    def load(self, run_id: str, path: str, with_optimizer: bool
             ) -> concurrent.futures.Future[types.LoadWeightsResponse]:
        client = self._client(run_id)
        method = client.load_state_with_optimizer if with_optimizer else client.load_state
        return adapt(_sdk_future(call(lambda: method(path))),
                     lambda _: types.LoadWeightsResponse(path=path, type="load_weights"))

    def snapshot(self, run_id: str, name: str | None) -> concurrent.futures.Future[RemoteSamplerHandle]:
        client = self._client(run_id)
        with self._lock:
            base_model = self._bases[run_id]
        # The SDK's snapshot is always unnamed; a name means a saved checkpoint as well. Both requests are sent now,
        # back to back, so they see the same weights and stay in order with this client's other requests.
        saved = None if name is None else self.save(run_id, "sampler_weights", name, None, True)
        sampler = adapt(_sdk_future(call(lambda: client.save_weights_and_get_sampling_client())), lambda s: s)
        out: concurrent.futures.Future[RemoteSamplerHandle] = concurrent.futures.Future()
        once = threading.Lock()

        def finish(_: object) -> None:
            if not sampler.done() or (saved is not None and not saved.done()) or not once.acquire(blocking=False):
                return  # the other part is still running, or the other callback already answered
            error = next((p.exception() for p in (saved, sampler) if p is not None and p.exception()), None)
            if error is not None:
                out.set_exception(error)
            else:
                out.set_result(RemoteSamplerHandle(sampler.result(), base_model, saved.result() if saved else None))

        for part in (saved, sampler):
            if part is not None:
                part.add_done_callback(finish)
        return out

    def close_session(self, run_id: str) -> concurrent.futures.Future[None]:
        # The server frees the adapter when this client's SDK session ends; here the client is only forgotten.
        with self._lock:
            self._clients.pop(run_id, None)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return done

    def release_collected(self, run_id: str) -> None:
        # A finalizer may run in a thread that holds self._lock already: no lock here (dict.pop is atomic).
        self._clients.pop(run_id, None)

    # -- sampling ------------------------------------------------------------------------------------------
    def handle_for_path(self, model_path: str) -> RemoteSamplerHandle:
        sampler = call(lambda: wait(self._service.create_sampling_client(model_path=model_path)))
        base_model = call(lambda: sampler.get_base_model())
        return RemoteSamplerHandle(sampler, base_model, model_path)

    def handle_for_base(self, base_model: str) -> RemoteSamplerHandle:
        sampler = call(lambda: wait(self._service.create_sampling_client(base_model=base_model)))
        return RemoteSamplerHandle(sampler, base_model, None)

    def sample(self, handle: RemoteSamplerHandle, prompt: types.ModelInput, num_samples: int,
               params: types.SamplingParams, include_prompt_logprobs: bool, topk_prompt_logprobs: int
               ) -> concurrent.futures.Future[types.SampleResponse]:
        sdk_prompt = to_sdk_model_input(self._sdk, prompt)
        sdk_params = to_sdk_sampling_params(self._sdk, params)
        sent = call(lambda: handle.client.sample(prompt=sdk_prompt, num_samples=num_samples,
                                                 sampling_params=sdk_params,
                                                 include_prompt_logprobs=include_prompt_logprobs,
                                                 topk_prompt_logprobs=topk_prompt_logprobs))
        return then(_sdk_future(sent), from_sdk_sample_response, self._result_error)

    def _result_error(self, exc: BaseException) -> BaseException:
        """A result's failure, as ``translate_error`` gives it, unless an older server's answer caused it."""
        if _drift.lacks_sample_sequence_ids(exc):
            return _drift.sampling_drift_error(self.base_url)
        if _drift.answered_json_not_protobuf(exc):
            return _drift.json_result_drift_error(self.base_url)
        return translate_error(exc)
