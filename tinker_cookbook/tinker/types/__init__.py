"""Request and response types of the Tinker-compatible API.

Names, fields and defaults follow the public Tinker documentation so that code written for the hosted
service runs unchanged. Models are pydantic; "Strict" ones reject unknown fields so that a typo in a
field name is an error rather than a silently ignored value.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

try:  # torch is a core dependency, but the types stay importable without it.
    import torch

    _HAVE_TORCH = True
except ImportError:  # pragma: no cover
    _HAVE_TORCH = False


class StrictBase(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())


class LooseBase(BaseModel):
    model_config = ConfigDict(protected_namespaces=())


ModelID: TypeAlias = str
TensorDtype: TypeAlias = Literal["int64", "float32"]
StopReason: TypeAlias = Literal["length", "stop"]
LossFnType: TypeAlias = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo",
                                "stable_reinforce"]
CheckpointType: TypeAlias = Literal["training", "sampler"]
CheckpointKind: TypeAlias = Literal["weights", "sampler_weights"]
"""The folder of a checkpoint in its ``tinker://`` path: ``weights`` (training state) or ``sampler_weights``."""
CHECKPOINT_KINDS: tuple[CheckpointKind, ...] = ("weights", "sampler_weights")

# ---------------------------------------------------------------------------------------------------------
# Model inputs
# ---------------------------------------------------------------------------------------------------------


class EncodedTextChunk(StrictBase):
    tokens: Sequence[int]
    """Token ids."""

    type: Literal["encoded_text"] = "encoded_text"

    @property
    def length(self) -> int:
        return len(self.tokens)


def _image_length(expected_tokens: int | None, kind: str) -> int:
    if expected_tokens is None:
        raise ValueError(f"{kind}.expected_tokens must be set to compute the chunk length")
    return expected_tokens


class ImageChunk(StrictBase):
    data: bytes
    """Encoded image bytes (base64 on the wire)."""

    format: Literal["png", "jpeg"]

    expected_tokens: int | None = None
    """How many model tokens the image becomes; checked against the model's image processor."""

    type: Literal["image"] = "image"

    @field_validator("data", mode="before")
    @classmethod
    def _decode_b64(cls, value: bytes | str) -> bytes:
        return base64.b64decode(value) if isinstance(value, str) else value

    @field_serializer("data")
    def _encode_b64(self, value: bytes) -> str:
        return base64.b64encode(value).decode("ascii")

    @property
    def length(self) -> int:
        return _image_length(self.expected_tokens, "ImageChunk")


class ImageAssetPointerChunk(StrictBase):
    format: Literal["png", "jpeg"]
    location: str
    """Path or URL of the image."""

    expected_tokens: int | None = None
    type: Literal["image_asset_pointer"] = "image_asset_pointer"

    @property
    def length(self) -> int:
        return _image_length(self.expected_tokens, "ImageAssetPointerChunk")


ModelInputChunk: TypeAlias = Annotated[
    EncodedTextChunk | ImageChunk | ImageAssetPointerChunk, Field(discriminator="type")
]


class ModelInput(StrictBase):
    chunks: list[ModelInputChunk]

    @classmethod
    def from_ints(cls, tokens: Sequence[int]) -> ModelInput:
        return cls(chunks=[EncodedTextChunk(tokens=list(tokens))])

    @classmethod
    def empty(cls) -> ModelInput:
        return cls(chunks=[])

    def to_ints(self) -> list[int]:
        """All token ids; raises ValueError if the input holds non-text (image) chunks."""
        if not all(isinstance(c, EncodedTextChunk) for c in self.chunks):
            kinds = [type(c).__name__ for c in self.chunks]
            raise ValueError(f"to_ints needs a ModelInput of EncodedTextChunks only, got chunks {kinds}")
        return [int(t) for c in self.chunks for t in c.tokens]  # type: ignore[union-attr]

    @property
    def length(self) -> int:
        return sum(c.length for c in self.chunks)

    def append(self, chunk: ModelInputChunk) -> ModelInput:
        """A new ModelInput with ``chunk`` added at the end."""
        return ModelInput(chunks=[*self.chunks, chunk])

    def append_int(self, token: int) -> ModelInput:
        """A new ModelInput with one more token at the end."""
        return self.append(EncodedTextChunk(tokens=[token]))


# ---------------------------------------------------------------------------------------------------------
# Tensors and training data
# ---------------------------------------------------------------------------------------------------------


def _numpy_dtype_name(dtype: np.dtype[Any]) -> TensorDtype:
    if dtype.kind == "f":
        return "float32"
    if dtype.kind in "iub":
        return "int64"
    raise ValueError(f"TensorData supports integer and float arrays, got numpy dtype {dtype}")


class TensorData(StrictBase):
    data: list[int] | list[float]
    """The tensor's values, flattened."""

    dtype: TensorDtype
    shape: list[int] | None = None
    """The tensor's shape; None means one-dimensional."""

    @classmethod
    def from_numpy(cls, array: npt.NDArray[Any]) -> TensorData:
        return cls(data=array.flatten().tolist(), dtype=_numpy_dtype_name(array.dtype), shape=list(array.shape))

    @classmethod
    def from_torch(cls, tensor: torch.Tensor) -> TensorData:
        dtype: TensorDtype = "float32" if tensor.dtype.is_floating_point else "int64"
        return cls(data=tensor.detach().cpu().flatten().tolist(), dtype=dtype, shape=list(tensor.shape))

    def to_numpy(self) -> npt.NDArray[Any]:
        array = np.asarray(self.data, dtype=np.float32 if self.dtype == "float32" else np.int64)
        return array.reshape(self.shape) if self.shape is not None else array

    def to_torch(self) -> torch.Tensor:
        return torch.from_numpy(self.to_numpy())

    def tolist(self) -> list[Any]:
        return self.to_numpy().tolist()


LossFnInputs: TypeAlias = dict[str, TensorData]
TensorDataLike: TypeAlias = "TensorData | Sequence[int] | Sequence[float] | npt.NDArray[Any] | torch.Tensor"
"""What ``Datum`` accepts for each loss input (lists, numpy arrays and torch tensors are converted)."""
LossFnOutput: TypeAlias = dict[str, TensorData]

# dtype of each well-known loss input, used when a plain list is given.
_KEY_DTYPES: dict[str, TensorDtype] = {
    "target_tokens": "int64",
    "weights": "float32",
    "advantages": "float32",
    "logprobs": "float32",
    "clip_low_threshold": "float32",
    "clip_high_threshold": "float32",
    "sequence_ratio_mask": "float32",
}


def _to_tensor_data(key: str, value: Any) -> Any:
    if _HAVE_TORCH and isinstance(value, torch.Tensor):
        td = TensorData.from_torch(value)
    elif isinstance(value, np.ndarray):
        td = TensorData.from_numpy(value)
    elif isinstance(value, (list, tuple)):
        if any(isinstance(v, (list, tuple)) for v in value):
            return _nested_to_tensor_data(key, value)
        dtype = _KEY_DTYPES.get(key)
        if dtype is None:
            dtype = "float32" if any(isinstance(v, float) for v in value) else "int64"
        data = [float(v) for v in value] if dtype == "float32" else [int(v) for v in value]
        return TensorData(data=data, dtype=dtype, shape=[len(value)])
    else:
        return value
    # Arrays keep their values but take the dtype the key calls for (e.g. int32 tokens -> int64).
    want = _KEY_DTYPES.get(key)
    if want is not None and want != td.dtype:
        data = [float(v) for v in td.data] if want == "float32" else [int(v) for v in td.data]
        td = TensorData(data=data, dtype=want, shape=td.shape)
    return td


def _nested_to_tensor_data(key: str, value: Sequence[Any]) -> TensorData:
    """A rectangular nested list (e.g. ``target_tokens=[[t0, t1], ...]``, k candidates per position) as TensorData.

    A ragged one has no shape; the error names the row lengths, since a tensor needs equal rows.
    """
    lengths = [len(v) if isinstance(v, (list, tuple)) else None for v in value]
    if len(set(lengths)) != 1 or lengths[0] is None:
        shown = ["scalar" if n is None else n for n in lengths[:8]] + (["..."] if len(lengths) > 8 else [])
        # A ValueError: pydantic reports it as the Datum's validation error, with this message.
        raise ValueError(
            f"loss_fn_inputs[{key!r}] is a ragged nested list (row lengths {shown}); a loss input is a tensor, "
            "so every row needs the same length: pad the rows (with weight 0) or pass a 1-D list"
        )
    array = np.asarray(value)
    dtype = _KEY_DTYPES.get(key) or ("float32" if array.dtype.kind == "f" else "int64")
    array = array.astype(np.float32 if dtype == "float32" else np.int64)
    return TensorData(data=array.flatten().tolist(), dtype=dtype, shape=list(array.shape))


class _ProvenanceSpanBase(StrictBase):
    sequence_id: str = Field(min_length=1)
    """The ``SampledSequence.sequence_id`` of a sequence sampled in this session."""

    offset: int = Field(default=0, ge=0)
    """Where the run starts within that sequence's prompt (prompt spans) or sampled tokens (sampled spans)."""

    length: int = Field(ge=0)
    """How many consecutive datum positions the run covers."""


class PromptProvenanceSpan(_ProvenanceSpanBase):
    """A run of datum positions that are positions ``[offset, offset + length)`` of the prompt of the sampling
    request that produced ``sequence_id``."""

    type: Literal["prompt"] = "prompt"


class SampledProvenanceSpan(_ProvenanceSpanBase):
    """A run of datum positions that are the sampled tokens ``[offset, offset + length)`` of ``sequence_id``."""

    type: Literal["sampled"] = "sampled"


ProvenanceSpan: TypeAlias = Annotated[PromptProvenanceSpan | SampledProvenanceSpan, Field(discriminator="type")]
ProvenanceSpans: TypeAlias = list[ProvenanceSpan]
"""Consecutive runs that tile one datum field: their lengths sum to its number of positions, in order."""


def check_tiling(field: str, spans: Sequence[Any], expected: int) -> None:
    """ValueError unless the runs of ``spans`` cover exactly ``expected`` positions."""
    total = sum(span.length for span in spans)
    if total != expected:
        raise ValueError(f"{field} covers {total} positions but the datum has {expected} there; the runs must "
                         "tile the field exactly (their lengths sum to its length)")


class Datum(StrictBase):
    loss_fn_inputs: LossFnInputs
    """Per-token inputs of the loss (``target_tokens``, ``weights``, ``logprobs``, ``advantages``, ...)."""

    model_input: ModelInput

    model_input_spans: ProvenanceSpans | None = None
    """Provenance of the input tokens: runs tiling ``model_input`` (set with ``with_provenance``)."""

    loss_fn_input_spans: ProvenanceSpans | None = None
    """Provenance of the loss rows: runs tiling ``loss_fn_inputs["target_tokens"]`` (set with ``with_provenance``)."""

    if TYPE_CHECKING:
        # What the constructor accepts (the validator below converts every value to TensorData), so that
        # type checkers do not flag the docs' ``loss_fn_inputs={"target_tokens": [1, 2], ...}``.
        def __init__(self, *, loss_fn_inputs: Mapping[str, TensorDataLike], model_input: ModelInput,
                     model_input_spans: Sequence[PromptProvenanceSpan | SampledProvenanceSpan] | None = None,
                     loss_fn_input_spans: Sequence[PromptProvenanceSpan | SampledProvenanceSpan] | None = None,
                     ) -> None: ...

    @model_validator(mode="before")
    @classmethod
    def _convert_tensors(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("loss_fn_inputs"), dict):
            data = dict(data)
            data["loss_fn_inputs"] = {k: _to_tensor_data(k, v) for k, v in data["loss_fn_inputs"].items()}
        return data

    @model_validator(mode="after")
    def _spans_in_pairs(self) -> Datum:
        if (self.model_input_spans is None) != (self.loss_fn_input_spans is None):
            raise ValueError("provenance comes as a pair: set both model_input_spans and loss_fn_input_spans "
                             "(Datum.with_provenance) or neither")
        return self

    def with_provenance(self, model_input: Sequence[PromptProvenanceSpan | SampledProvenanceSpan],
                        loss_fn_inputs: Sequence[PromptProvenanceSpan | SampledProvenanceSpan]) -> Datum:
        """A copy naming the sampled sequence behind every position: ``model_input`` runs tile the input tokens,
        ``loss_fn_inputs`` runs tile ``target_tokens``. The tiling is checked here, at the call site."""
        check_tiling("with_provenance model_input", model_input, self.model_input.length)
        targets = self.loss_fn_inputs.get("target_tokens")
        if targets is not None:
            rows = targets.shape[0] if targets.shape else len(targets.data)
            check_tiling("with_provenance loss_fn_inputs", loss_fn_inputs, rows)
        return self.model_copy(update={"model_input_spans": list(model_input),
                                       "loss_fn_input_spans": list(loss_fn_inputs)})


class AdamParams(StrictBase):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    """Decoupled (AdamW) weight decay."""

    grad_clip_norm: float = 0.0
    """Clip the global gradient norm to this value; 0 disables clipping."""


def validation_summary(exc: ValidationError) -> str:
    """pydantic's errors as ``field=value: problem; ...`` (for BadRequestError messages)."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ())) or "value"
        parts.append(f"{where}={error.get('input')!r}: {error.get('msg')}")
    return "; ".join(parts)


class LoraConfig(StrictBase):
    rank: int
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class ForwardBackwardInput(StrictBase):
    data: list[Datum]
    loss_fn: LossFnType
    loss_fn_config: dict[str, float] | None = None


class ForwardBackwardOutput(LooseBase):
    loss_fn_output_type: str
    loss_fn_outputs: list[LossFnOutput]
    """One dict per datum; each holds the ``logprobs`` of its target tokens."""

    metrics: dict[str, float]


class OptimStepResponse(LooseBase):
    metrics: dict[str, float] | None = None


class SaveWeightsResponse(LooseBase):
    path: str
    """``tinker://<run_id>/weights/<name>``"""

    type: Literal["save_weights"] | None = None


class SaveWeightsForSamplerResponse(LooseBase):
    path: str
    """``tinker://<run_id>/sampler_weights/<name>``"""

    type: Literal["save_weights_for_sampler"] | None = None


class LoadWeightsResponse(LooseBase):
    path: str | None = None
    model_id: ModelID | None = None
    """The training client the weights were loaded onto."""

    type: Literal["load_weights"] | None = None


class ModelData(LooseBase):
    arch: str | None = None
    model_name: str | None = None
    tokenizer_id: str | None = None


class AdamOptimizerConfig(LooseBase):
    """The optimizer family a training client steps with (AdamW, the only one here)."""

    type: Literal["adamw"] = "adamw"


class GetInfoResponse(LooseBase):
    type: Literal["get_info"] | None = None
    model_data: ModelData
    model_id: ModelID
    is_lora: bool | None = None
    lora_rank: int | None = None
    model_name: str | None = None
    optimizer_config: AdamOptimizerConfig = AdamOptimizerConfig()


class SupportedModel(LooseBase):
    model_name: str | None = None
    max_context_length: int | None = None
    trainable: bool | None = None
    sampleable: bool | None = None


class GetServerCapabilitiesResponse(LooseBase):
    supported_models: list[SupportedModel]
    supported_loss_fns: list[str] | None = None
    """The built-in losses ``forward_backward`` accepts here (``custom`` runs on the client)."""


class CreateModelResponse(LooseBase):
    model_id: ModelID
    type: Literal["create_model"] = "create_model"


class UnloadModelResponse(LooseBase):
    model_id: ModelID
    type: Literal["unload_model"] | None = None


# ---------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------


class SamplingParams(LooseBase):
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | Sequence[str] | Sequence[int] | None = None
    temperature: float = 1.0
    top_k: int = -1
    """-1 means no limit."""

    top_p: float = 1.0


class SampledSequence(LooseBase):
    stop_reason: StopReason
    tokens: list[int]
    logprobs: list[float] | None = None
    """Logprob of each sampled token under the temperature-scaled distribution."""

    sequence_id: str | None = None
    """Names this sequence in a later request of the same session (a datum's provenance spans)."""


class SampleResponse(LooseBase):
    sequences: Sequence[SampledSequence]
    type: Literal["sample"] = "sample"
    prompt_logprobs: list[float | None] | None = None
    """With include_prompt_logprobs: one value per prompt token, the first None."""

    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = None
    """With topk_prompt_logprobs=k: up to k (token_id, logprob) pairs per prompt token, the first None."""

    prompt_cache_hit_tokens: int = 0
    """Prompt tokens served from a prefix cache (none here: every prompt is prefilled)."""


# ---------------------------------------------------------------------------------------------------------
# Runs and checkpoints
# ---------------------------------------------------------------------------------------------------------

# Used with fullmatch: a trailing "$" would also accept a path that ends in a newline.
# The hosted service names a run "<session id>:train:<n>" (its n-th training client); that suffix is optional here.
_TINKER_PATH = re.compile(r"tinker://(?P<run>[A-Za-z0-9_.-]+)(?::train:(?P<client>[0-9]+))?"
                          r"/(?P<kind>weights|sampler_weights)/(?P<name>[A-Za-z0-9_.-]+)")


class ParsedCheckpointTinkerPath(LooseBase):
    """A parsed ``tinker://<run_id>/(weights|sampler_weights)/<name>`` path: the one parser of checkpoint paths.

    The hosted form ``tinker://<id>:train:<n>/...`` (the run of the n-th training client of session ``<id>``) is
    accepted too and maps to the local run ``<id>``: locally every training client is its own run, named without
    the suffix, so ``training_run_id`` is ``<id>`` and the path resolves like ``tinker://<id>/...``.
    """

    tinker_path: str
    training_run_id: str
    checkpoint_type: CheckpointType
    checkpoint_id: str
    """``weights/<name>`` or ``sampler_weights/<name>``."""

    @classmethod
    def from_tinker_path(cls, tinker_path: Any) -> ParsedCheckpointTinkerPath:
        expected = ("expected tinker://<run_id>/weights/<name> or tinker://<run_id>/sampler_weights/<name>, "
                    "<run_id> optionally followed by the hosted form's ':train:<n>' (names use letters, digits, "
                    "'_', '-', '.'; list them with `tinker-cookbook checkpoint list`)")
        if not isinstance(tinker_path, str):
            raise ValueError(f"checkpoint path must be a string, got {tinker_path!r}; {expected}")
        if not tinker_path.startswith("tinker://"):
            scheme = tinker_path.split("://", 1)[0] + "://" if "://" in tinker_path else "no scheme"
            raise ValueError(f"checkpoint path {tinker_path!r} is not a tinker:// path ({scheme}); {expected}")
        match = _TINKER_PATH.fullmatch(tinker_path)
        if match is None or match["name"].startswith(".") or match["run"].startswith("."):
            raise ValueError(f"malformed checkpoint path {tinker_path!r}; {expected}")
        kind = match["kind"]
        return cls(
            tinker_path=tinker_path,
            training_run_id=match["run"],
            checkpoint_type="training" if kind == "weights" else "sampler",
            checkpoint_id=f"{kind}/{match['name']}",
        )


def format_tinker_path(run_id: str, kind: CheckpointKind, name: str) -> str:
    """``tinker://<run_id>/<kind>/<name>``: the one builder of checkpoint paths (``ParsedCheckpointTinkerPath``
    parses them). It checks nothing: whoever reads the path parses it, and the parser names what is wrong."""
    return f"tinker://{run_id}/{kind}/{name}"


class Checkpoint(LooseBase):
    checkpoint_id: str
    checkpoint_type: CheckpointType
    time: datetime
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    expires_at: datetime | None = None
    user_metadata: dict[str, str] | None = None


class TrainingRun(LooseBase):
    training_run_id: str
    base_model: str
    model_owner: str = "local"
    is_lora: bool = True
    corrupted: bool = False
    lora_rank: int | None = None
    last_request_time: datetime | None = None
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None
    user_metadata: dict[str, str] | None = None


class Cursor(LooseBase):
    offset: int
    limit: int
    total_count: int


class TrainingRunsResponse(LooseBase):
    training_runs: list[TrainingRun]
    cursor: Cursor | None = None


class CheckpointsListResponse(LooseBase):
    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None


class WeightsInfoResponse(LooseBase):
    base_model: str
    is_lora: bool
    lora_rank: int | None = None
    train_unembed: bool | None = None
    train_mlp: bool | None = None
    train_attn: bool | None = None
    optimizer_config: AdamOptimizerConfig = AdamOptimizerConfig()


class CheckpointArchiveUrlResponse(LooseBase):
    url: str
    """A ``file://`` URL of a tar archive of the checkpoint (the local stand-in for a signed URL)."""

    expires: datetime | None = None
