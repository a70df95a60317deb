"""Completers: policies that can be sampled from.

``TokenCompleter`` maps a token prompt and a stop condition to sampled tokens with their logprobs; RL trains on
exactly those tokens. ``MessageCompleter`` maps a conversation to the next assistant message (judges, answerer
models in multi-agent envs, evals). ``TinkerTokenCompleter`` and ``TinkerMessageCompleter`` wrap a
``tinker.SamplingClient``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from tinker_cookbook import tinker

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

StopCondition: TypeAlias = list[str] | list[int]


@dataclass
class TokensWithLogprobs:
    """Sampled tokens, the sampler's logprob of each (None when not recorded) and why sampling stopped."""

    tokens: list[int]
    maybe_logprobs: list[float] | None
    stop_reason: Literal["stop", "length"] = "stop"

    @property
    def logprobs(self) -> list[float]:
        if self.maybe_logprobs is None:
            raise ValueError("these tokens were sampled without logprobs; RL training needs them")
        return self.maybe_logprobs


class TokenCompleter(ABC):
    """A policy on tokens."""

    @abstractmethod
    async def __call__(
        self, model_input: tinker.ModelInput, stop: StopCondition, *, max_tokens: int | None = None
    ) -> TokensWithLogprobs:
        """Sample one continuation of ``model_input`` that ends at a stop sequence or the token limit."""


class MessageCompleter(ABC):
    """A policy on messages."""

    @abstractmethod
    async def __call__(self, messages: list[Message]) -> Message:
        """The next assistant message after ``messages``."""


class TinkerTokenCompleter(TokenCompleter):
    """Samples one continuation from a ``tinker.SamplingClient``.

    ``max_tokens`` is the default budget; a per-call ``max_tokens`` lowers it, and with ``context_window`` set the
    budget is also capped so that prompt plus completion fit the window. With ``seed`` set, call ``k`` of this
    completer samples with seed ``seed + k``: calls made in the same order get the same tokens (the training loop
    uses this to make reruns and resumed runs sample identically).
    """

    def __init__(self, sampling_client: tinker.SamplingClient, max_tokens: int, temperature: float = 1.0,
                 context_window: int | None = None, seed: int | None = None) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be at least 1")
        self.sampling_client = sampling_client
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.context_window = context_window
        self.seed = seed
        self._calls = 0

    def _next_seed(self) -> int | None:
        if self.seed is None:
            return None
        self._calls += 1
        return (self.seed + self._calls - 1) % (2**31)

    def _budget(self, prompt_len: int, max_tokens: int | None) -> int:
        budget = self.max_tokens if max_tokens is None else min(self.max_tokens, max_tokens)
        if self.context_window is not None:
            budget = min(budget, self.context_window - prompt_len)
        if budget < 1:
            raise ValueError(f"the prompt has {prompt_len} tokens, which leaves no room to sample within "
                             f"context_window={self.context_window}; shorten the prompt or raise the window")
        return budget

    async def __call__(
        self, model_input: tinker.ModelInput, stop: StopCondition, *, max_tokens: int | None = None
    ) -> TokensWithLogprobs:
        params = tinker.SamplingParams(max_tokens=self._budget(model_input.length, max_tokens),
                                       temperature=self.temperature, stop=stop, seed=self._next_seed())
        response = await self.sampling_client.sample_async(prompt=model_input, num_samples=1, sampling_params=params)
        sequence = response.sequences[0]
        return TokensWithLogprobs(
            tokens=list(sequence.tokens), maybe_logprobs=sequence.logprobs, stop_reason=sequence.stop_reason
        )


class TinkerMessageCompleter(MessageCompleter):
    """Renders the conversation, samples one reply and parses it back into an assistant message."""

    def __init__(self, sampling_client: tinker.SamplingClient, renderer: Renderer, max_tokens: int,
                 stop_condition: StopCondition | None = None, temperature: float = 1.0) -> None:
        self.sampling_client = sampling_client
        self.renderer = renderer
        self.max_tokens = max_tokens
        self.stop_condition = stop_condition if stop_condition is not None else renderer.get_stop_sequences()
        self.temperature = temperature

    async def __call__(self, messages: list[Message]) -> Message:
        prompt = self.renderer.build_generation_prompt(messages)
        params = tinker.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                                       stop=self.stop_condition)
        response = await self.sampling_client.sample_async(prompt=prompt, num_samples=1, sampling_params=params)
        parsed, _termination = self.renderer.parse_response(list(response.sequences[0].tokens))
        reply: dict[str, Any] = {"role": "assistant", "content": parsed["content"]}
        if parsed.get("tool_calls"):
            reply["tool_calls"] = parsed["tool_calls"]
        return reply  # type: ignore[return-value]  # a Message TypedDict built field by field
