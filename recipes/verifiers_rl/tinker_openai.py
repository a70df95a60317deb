"""An OpenAI-style async client that samples from a ``tinker.SamplingClient`` (the official cookbook's
``TinkerAsyncOpenAIClient``), so a ``verifiers`` environment can be run and scored with a policy outside the RL
loop (``recipes.verifiers_rl.evaluate``).

``client.chat.completions.create(messages=..., max_tokens=..., temperature=...)`` renders the messages with the
policy's renderer, samples one reply and parses it back (``finish_reason`` "stop" when it ended at the renderer's
stop sequence, else "length"); ``client.completions.create(prompt=...)`` samples a plain-text continuation. Both
return the ``openai`` package's response types, with the sampled token ids and their logprobs. Streaming and tool
calls are refused. The client is duck-typed (``verifiers`` only calls these two methods), so no OpenAI key or
server is involved.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from tinker_cookbook import tinker
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.renderers import Renderer
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text
from tinker_cookbook.rl.verifiers_env import as_messages


def _params(kwargs: dict[str, Any], default_stop: Any) -> tinker.SamplingParams:
    """The OpenAI request's sampling arguments as ``SamplingParams`` (others, like ``n`` or ``seed``, are ignored)."""
    if kwargs.get("stream"):
        raise ConfigurationError("stream=True: the Tinker client returns whole responses; call without streaming")
    max_tokens = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or 128
    return tinker.SamplingParams(max_tokens=int(max_tokens), temperature=float(kwargs.get("temperature", 1.0)),
                                 top_p=float(kwargs.get("top_p") or 1.0), top_k=int(kwargs.get("top_k") or -1),
                                 stop=kwargs.get("stop") or default_stop)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class TinkerChatCompletions:
    def __init__(self, parent: TinkerAsyncOpenAIClient) -> None:
        self._parent = parent

    async def create(self, *, messages: list[dict[str, Any]], model: str = "tinker", tools: Any = None,
                     **kwargs: Any) -> Any:
        from openai.types.chat import ChatCompletion

        if tools:
            raise ConfigurationError("the request offers tools; the Tinker client supports chat without tools")
        renderer = self._parent.renderer
        prompt = renderer.build_generation_prompt(as_messages(messages))
        response = await self._parent.sampling_client.sample_async(
            prompt, 1, _params(kwargs, renderer.get_stop_sequences()))
        seq = response.sequences[0]
        message, termination = renderer.parse_response(seq.tokens)
        logprobs = seq.logprobs or [0.0] * len(seq.tokens)
        completion = ChatCompletion.model_validate({
            "id": f"tinker-chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "usage": _usage(prompt.length, len(seq.tokens)),
            "choices": [{"index": 0, "finish_reason": "stop" if is_stop_sequence_termination(termination) else "length",
                         "message": {"role": "assistant", "content": message_text(message)},
                         "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "top_logprobs": []}
                                                  for t, lp in zip(seq.tokens, logprobs, strict=True)]}}],
        })
        object.__setattr__(completion, "prompt_token_ids", prompt.to_ints())
        object.__setattr__(completion.choices[0], "token_ids", list(seq.tokens))
        return completion


class TinkerCompletions:
    def __init__(self, parent: TinkerAsyncOpenAIClient) -> None:
        self._parent = parent

    async def create(self, *, prompt: str, model: str = "tinker", **kwargs: Any) -> Any:
        from openai.types.completion import Completion

        tokenizer = self._parent.tokenizer
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
        response = await self._parent.sampling_client.sample_async(
            tinker.ModelInput.from_ints(prompt_ids), 1, _params(kwargs, None))
        seq = response.sequences[0]
        completion = Completion.model_validate({
            "id": f"tinker-cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion", "created": int(time.time()),
            "model": model, "usage": _usage(len(prompt_ids), len(seq.tokens)),
            "choices": [{"index": 0, "text": tokenizer.decode(seq.tokens),
                         "finish_reason": "length" if seq.stop_reason == "length" else "stop",
                         "logprobs": {"tokens": [f"token_id:{t}" for t in seq.tokens],
                                      "token_logprobs": seq.logprobs or [0.0] * len(seq.tokens)}}],
        })
        object.__setattr__(completion.choices[0], "prompt_token_ids", prompt_ids)
        object.__setattr__(completion.choices[0], "token_ids", list(seq.tokens))
        return completion


class _Chat:
    def __init__(self, parent: TinkerAsyncOpenAIClient) -> None:
        self.completions = TinkerChatCompletions(parent)


class TinkerAsyncOpenAIClient:
    """``chat.completions.create`` and ``completions.create`` answered by ``sampling_client``."""

    def __init__(self, sampling_client: tinker.SamplingClient, renderer: Renderer, tokenizer: Any = None) -> None:
        self.sampling_client, self.renderer = sampling_client, renderer
        self.tokenizer = tokenizer if tokenizer is not None else renderer.tokenizer
        self.chat = _Chat(self)
        self.completions = TinkerCompletions(self)

    def set_sampling_client(self, sampling_client: tinker.SamplingClient) -> None:
        """Answer later requests with another client (e.g. the policy's newest weights)."""
        self.sampling_client = sampling_client
