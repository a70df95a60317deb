"""The verifiers recipe's OpenAI-style client on a scripted sampling client, and the evaluation's summary (no
model)."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs openai")

from recipes.verifiers_rl.evaluate import CLIConfig, cli_main, summarize  # noqa: E402
from recipes.verifiers_rl.tinker_openai import TinkerAsyncOpenAIClient  # noqa: E402
from tinker_cookbook.exceptions import ConfigurationError  # noqa: E402
from tinker_cookbook.rl.multiturn.message_env import renderer_for  # noqa: E402

CHATML = renderer_for("HuggingFaceTB/SmolLM2-135M-Instruct")  # the packaged tokenizer only


class ScriptedSampler:
    """Answers every request with ``tokens`` (logprob -0.5 each) and records the prompt and parameters."""

    def __init__(self, tokens: list[int], stop_reason: str = "stop") -> None:
        self.tokens, self.stop_reason = tokens, stop_reason
        self.requests: list[tuple[list[int], object]] = []

    async def sample_async(self, prompt, num_samples, params):
        self.requests.append((prompt.to_ints(), params))
        seq = SimpleNamespace(tokens=self.tokens, logprobs=[-0.5] * len(self.tokens), stop_reason=self.stop_reason)
        return SimpleNamespace(sequences=[seq])


def _encode(text: str) -> list[int]:
    return CHATML.tokenizer.encode(text, add_special_tokens=False)


def test_a_chat_request_is_rendered_sampled_and_parsed_back():
    stop = CHATML.get_stop_sequences()[0]
    sampler = ScriptedSampler(_encode("12") + [stop])
    client = TinkerAsyncOpenAIClient(sampler, CHATML)
    messages = [{"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": [{"type": "text", "text": "What is 5 + 7?"}]}]
    response = asyncio.run(client.chat.completions.create(model="m", messages=messages, max_tokens=8,
                                                          temperature=0.5))
    choice = response.choices[0]
    assert choice.message.content == "12" and choice.finish_reason == "stop"
    assert [c.logprob for c in choice.logprobs.content] == [-0.5] * len(sampler.tokens)
    prompt, params = sampler.requests[0]
    assert prompt == CHATML.build_generation_prompt([{"role": "system", "content": "Answer with the number only."},
                                                     {"role": "user", "content": "What is 5 + 7?"}]).to_ints()
    assert (params.max_tokens, params.temperature, params.stop) == (8, 0.5, CHATML.get_stop_sequences())
    assert response.usage.prompt_tokens == len(prompt) and choice.token_ids == sampler.tokens


def test_a_reply_cut_off_before_the_stop_sequence_finishes_by_length():
    client = TinkerAsyncOpenAIClient(ScriptedSampler(_encode("To solve")), CHATML)
    response = asyncio.run(client.chat.completions.create(messages=[{"role": "user", "content": "1 + 1?"}]))
    assert response.choices[0].finish_reason == "length" and response.choices[0].message.content == "To solve"


def test_plain_completions_decode_the_sample_and_streaming_or_tools_are_refused():
    sampler = ScriptedSampler(_encode(" world"), stop_reason="length")
    client = TinkerAsyncOpenAIClient(sampler, CHATML)
    response = asyncio.run(client.completions.create(prompt="Hello", max_tokens=3))
    assert response.choices[0].text == " world" and response.choices[0].finish_reason == "length"
    assert sampler.requests[0][0] == CHATML.tokenizer.encode("Hello", add_special_tokens=True)
    with pytest.raises(ConfigurationError, match="stream=True"):
        asyncio.run(client.chat.completions.create(messages=[{"role": "user", "content": "x"}], stream=True))
    with pytest.raises(ConfigurationError, match="tools"):
        asyncio.run(client.chat.completions.create(messages=[{"role": "user", "content": "x"}], tools=[{}]))


def test_the_summary_is_the_mean_and_spread_of_reward_and_metrics():
    results = {"reward": [1.0, 0.0, 1.0, 1.0], "metrics": {"correct_sum": [1.0, 0.0, 1.0, 1.0], "empty": []}}
    # mean 0.75; population std sqrt(((0.25)^2·3 + 0.75^2) / 4) = sqrt(0.1875)
    assert summarize(results) == {"reward": (0.75, pytest.approx(math.sqrt(0.1875))),
                                  "correct_sum": (0.75, pytest.approx(math.sqrt(0.1875)))}


def test_bad_env_arguments_name_the_field():
    with pytest.raises(ConfigurationError, match="vf_env_args='{num_eval: 8}' is not JSON"):
        asyncio.run(cli_main(CLIConfig(vf_env_args="{num_eval: 8}")))
    with pytest.raises(ConfigurationError, match="must be a JSON object"):
        asyncio.run(cli_main(CLIConfig(vf_env_args="[1]")))
