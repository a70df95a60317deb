"""SamplingClient: samples and logprobs from fixed weights (a base model or a saved/snapshotted adapter)."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from tinker_cookbook.tinker import provenance, types
from tinker_cookbook.tinker.errors import BadRequestError
from tinker_cookbook.tinker.futures import APIFuture

if TYPE_CHECKING:
    from tinker_cookbook.tinker.backend import Backend, SamplerHandle


def check_sampling_client_options(record_stability_info: bool = False, kind: str = "snapshot") -> None:
    """Refuse, by name, the official SDK's sampling-client options this engine does not provide."""
    if record_stability_info:
        raise BadRequestError(
            "record_stability_info=True is not supported: it records what the stable_reinforce loss trains on, and "
            "this engine does not provide that loss; leave it False and train with ppo, cispo, gspo or "
            "importance_sampling")
    if kind != "snapshot":
        raise BadRequestError(
            f"kind={kind!r} is not supported: sampling clients hold fixed weights (kind='snapshot'); call "
            "save_weights_and_get_sampling_client() again after training to sample newer weights")


class SamplingClient:
    """Also a finished future of itself (``result()``, ``await``), as the SDK's client-creation methods return
    futures of their clients: code written either way runs unchanged."""

    def __init__(self, backend: Backend[Any], handle: SamplerHandle) -> None:
        self._backend = backend
        self._handle = handle

    def result(self, timeout: float | None = None) -> SamplingClient:
        return self

    async def result_async(self, timeout: float | None = None) -> SamplingClient:
        return self

    def __await__(self) -> Generator[Any, None, SamplingClient]:
        return self.result_async().__await__()

    @property
    def model_path(self) -> str | None:
        return self._handle.model_path

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0) -> APIFuture[types.SampleResponse]:
        """Sample ``num_samples`` continuations of ``prompt``; the prompt is prefilled once and shared.

        Every returned sequence carries a ``sequence_id`` that a training datum's provenance spans can name."""
        try:
            future = self._backend.sample(self._handle, prompt, num_samples, sampling_params,
                                          include_prompt_logprobs, topk_prompt_logprobs)
            prompt_length = provenance.prompt_length(prompt)
        except (BadRequestError, ValueError) as exc:
            return APIFuture.failed(exc if isinstance(exc, BadRequestError) else BadRequestError(str(exc)))
        return APIFuture(future).map(lambda response: provenance.LOCAL.attach(prompt_length, response))

    async def sample_async(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
                           include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0) -> types.SampleResponse:
        return await self.sample(prompt, num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs)

    def compute_logprobs(self, prompt: types.ModelInput) -> APIFuture[list[float | None]]:
        """Logprob of every prompt token given the ones before it; the first entry is None."""
        params = types.SamplingParams(max_tokens=1, temperature=1.0)
        return self.sample(prompt, 1, params, include_prompt_logprobs=True).map(
            lambda response: list(response.prompt_logprobs or []))

    async def compute_logprobs_async(self, prompt: types.ModelInput) -> list[float | None]:
        return await self.compute_logprobs(prompt)

    def get_tokenizer(self) -> Any:
        return self._handle.tokenizer

    def get_base_model(self) -> str:
        return self._handle.base_model

    async def get_base_model_async(self) -> str:
        return self._handle.base_model

    def __repr__(self) -> str:
        return f"SamplingClient(base_model={self._handle.base_model!r}, model_path={self._handle.model_path!r})"
