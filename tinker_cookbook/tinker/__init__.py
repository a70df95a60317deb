"""A Tinker-compatible API backed by a local LoRA engine.

Port code written for the official SDK by replacing ``import tinker`` with
``from tinker_cookbook import tinker``::

    from tinker_cookbook import tinker
    from tinker_cookbook.tinker import lib, types

    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct")

``ServiceClient(base_url="http://host:port")`` runs the same clients on a Tinker-protocol server (``tinker-cookbook
serve``, or the hosted service) through the official ``tinker`` SDK (``pip install 'tinker==0.38.0'``, the ``remote`` extra).
"""

from tinker_cookbook.tinker import lib, types
from tinker_cookbook.tinker.errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BillingError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestFailedError,
    TinkerError,
    UnprocessableEntityError,
)
from tinker_cookbook.tinker.futures import APIFuture
from tinker_cookbook.tinker.rest_client import RestClient
from tinker_cookbook.tinker.sampling_client import SamplingClient
from tinker_cookbook.tinker.service_client import ServiceClient
from tinker_cookbook.tinker.training_client import TrainingClient
from tinker_cookbook.tinker.types import (
    AdamParams,
    Checkpoint,
    Datum,
    EncodedTextChunk,
    ForwardBackwardOutput,
    ImageAssetPointerChunk,
    ImageChunk,
    LoraConfig,
    ModelInput,
    ModelInputChunk,
    OptimStepResponse,
    ParsedCheckpointTinkerPath,
    PromptProvenanceSpan,
    ProvenanceSpans,
    SampledProvenanceSpan,
    SampledSequence,
    SampleResponse,
    SamplingParams,
    StopReason,
    TensorData,
    TensorDtype,
    TrainingRun,
)

__all__ = [
    "APIConnectionError", "APIError", "APIFuture", "APIResponseValidationError", "APIStatusError",
    "APITimeoutError", "AdamParams", "AuthenticationError", "BadRequestError", "BillingError", "Checkpoint",
    "ConflictError", "Datum", "EncodedTextChunk", "ForwardBackwardOutput", "ImageAssetPointerChunk",
    "ImageChunk", "InternalServerError", "LoraConfig", "ModelInput", "ModelInputChunk", "NotFoundError",
    "OptimStepResponse", "ParsedCheckpointTinkerPath", "PermissionDeniedError", "PromptProvenanceSpan",
    "ProvenanceSpans", "RateLimitError",
    "RequestFailedError", "RestClient", "SampleResponse", "SampledProvenanceSpan", "SampledSequence", "SamplingClient",
    "SamplingParams", "ServiceClient", "StopReason", "TensorData", "TensorDtype", "TinkerError",
    "TrainingClient", "TrainingRun", "UnprocessableEntityError", "lib", "types",
]
