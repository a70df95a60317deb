"""The request bodies of the Tinker wire protocol (``tinker_api``'s routes), as strict pydantic models.

Strict: an unknown field is a 400 that names it, so a client sending a field this server does not understand
learns so instead of having it silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from tinker_cookbook.tinker import types


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


def _adamw_only(family: str) -> str:
    if family != "adamw":
        raise ValueError(f"optimizer {family!r} is not supported by this server; it trains with AdamW only: create "
                         "the training client without optimizer= (or with the adamw config) and step with AdamParams")
    return family


class _OptimizerConfig(BaseModel):
    # Open like the SDK's OptimizerConfigBase (families carry their own fields); only adamw is served.
    model_config = ConfigDict(extra="allow")
    type: str = "adamw"

    _family = field_validator("type")(_adamw_only)


class _OptimizerParams(BaseModel):
    """The SDK's per-step parameters of a non-Adam family (sent as ``optimizer_params``), to refuse by name."""

    model_config = ConfigDict(extra="allow")
    type: str

    _family = field_validator("type")(_adamw_only)


class CreateSessionBody(_Body):
    tags: list[str] = []
    user_metadata: dict[str, Any] | None = None
    sdk_version: str | None = None
    project_id: str | None = None
    display_name: str | None = None
    type: Literal["create_session"] = "create_session"


class SessionHeartbeatBody(_Body):
    session_id: str
    type: Literal["session_heartbeat"] = "session_heartbeat"


class ClientConfigBody(_Body):
    sdk_version: str | None = None


class CreateModelBody(_Body):
    session_id: str
    model_seq_id: int
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: types.LoraConfig | None = None
    optimizer_config: _OptimizerConfig = _OptimizerConfig()
    type: Literal["create_model"] = "create_model"


class GetInfoBody(_Body):
    model_id: str
    type: Literal["get_info"] = "get_info"


class OptimStepBody(_Body):
    model_id: str
    adam_params: types.AdamParams | None = None
    optimizer_params: _OptimizerParams | None = None
    seq_id: int | None = None
    type: Literal["optim_step"] = "optim_step"


class SaveWeightsBody(_Body):
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None
    type: Literal["save_weights"] = "save_weights"


class SaveWeightsForSamplerBody(_Body):
    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: str = "snapshot"
    seq_id: int | None = None
    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"

    @field_validator("kind")
    @classmethod
    def _snapshot_only(cls, kind: str) -> str:
        if kind != "snapshot":
            raise ValueError(f"kind={kind!r} is not supported by this server: its sampling clients hold fixed weights "
                             "(kind='snapshot'); call save_weights_and_get_sampling_client() again after training "
                             "to sample newer weights")
        return kind


class LoadWeightsBody(_Body):
    path: str
    optimizer: bool
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    optimizer_config: _OptimizerConfig | None = None
    weights_access_token: str | None = None
    type: Literal["load_weights"] = "load_weights"


class CreateSamplingSessionBody(_Body):
    session_id: str
    sampling_session_seq_id: int
    base_model: str | None = None
    model_path: str | None = None
    type: Literal["create_sampling_session"] = "create_sampling_session"


class JoinSamplingSessionBody(_Body):
    sampling_session_id: str
    type: Literal["join_sampling_session"] = "join_sampling_session"


class SampleBody(_Body):
    prompt: types.ModelInput
    sampling_params: types.SamplingParams
    num_samples: int = 1
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    # Accepted only at their "off" values: this server does not implement them (checked in the route).
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None
    type: Literal["sample"] = "sample"


class RetrieveFutureBody(_Body):
    request_id: str
    allow_metadata_only: bool = False


class WeightsInfoBody(_Body):
    tinker_path: str


class TtlBody(_Body):
    ttl_seconds: int | None = None
