"""The OpenAI chat route with real clients' habits: fields it ignores, tool calling, response formats.

A tiny random model never calls a tool by itself, so the tool-calling replies come from a scripted sampler: the
real local backend behind the real server, except that ``sample`` records the prompt it gets and answers with a
fixed text. Everything else (request parsing, rendering with the Qwen3 renderer, parsing the reply, the JSON the
``openai`` client reads) is the production path. The requests that need no particular reply run unscripted.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import openai
import pytest

from tinker_cookbook.backends import local_backend
from tinker_cookbook.base.tokenizers import get_tokenizer
from tinker_cookbook.server import BackgroundServer, create_app
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-qwen3"  # qwen3 renderer: <tool_call> blocks
CHATML_MODEL = "tinker-cookbook/tiny-smollm2"  # chatml renderer: no tool-calling format
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
USER = {"role": "user", "content": "Weather in Paris?"}


class ScriptedBackend:
    """The local backend, but ``sample`` records its prompt and answers ``script`` (when set) as sampled text."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.script: str | None = None
        self.prompts: list[types.ModelInput] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self, handle: Any, prompt: types.ModelInput, num_samples: int, params: types.SamplingParams,
               include_prompt_logprobs: bool, topk_prompt_logprobs: int
               ) -> concurrent.futures.Future[types.SampleResponse]:
        self.prompts.append(prompt)
        if self.script is None:
            return self.inner.sample(handle, prompt, num_samples, params, include_prompt_logprobs,
                                     topk_prompt_logprobs)
        tokenizer = get_tokenizer(MODEL)
        tokens = [*tokenizer.encode(self.script), tokenizer.convert_tokens_to_ids("<|im_end|>")]
        future: concurrent.futures.Future[types.SampleResponse] = concurrent.futures.Future()
        future.set_result(types.SampleResponse(sequences=[
            types.SampledSequence(stop_reason="stop", tokens=tokens, logprobs=[-0.5] * len(tokens))]))
        return future


@pytest.fixture(scope="module")
def backend() -> ScriptedBackend:
    return ScriptedBackend(local_backend())


@pytest.fixture(scope="module")
def client(backend):
    with BackgroundServer(create_app(backend)) as running:  # type: ignore[arg-type]
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="unused-on-loopback", max_retries=0)


@pytest.fixture
def scripted(backend):
    """Set ``backend.script`` for one test; the prompts the sampler got are in ``backend.prompts``."""
    backend.prompts.clear()
    yield backend
    backend.script = None


def _prompt_text(backend: ScriptedBackend) -> str:
    return str(get_tokenizer(MODEL).decode(backend.prompts[-1].to_ints()))


def test_a_returned_message_goes_back_as_it_came(client):
    first = client.chat.completions.create(model=CHATML_MODEL, messages=[USER], max_tokens=5, seed=1)
    returned = first.choices[0].message
    assert returned.refusal is None
    follow_up = [USER, returned, {"role": "user", "content": "And in Rome?"}]
    raw = client.chat.completions.with_raw_response.create(model=CHATML_MODEL, messages=follow_up, max_tokens=5)
    assert raw.http_response.status_code == 200
    assert "warning" not in raw.headers  # refusal=None etc. ask for nothing: nothing is ignored
    assert raw.parse().choices[0].message.role == "assistant"


def test_fields_that_do_not_change_sampling_are_named_in_a_warning_header(client):
    refused = {"role": "assistant", "content": "No.", "refusal": "I cannot help with that.", "annotations": []}
    parts = {"role": "assistant", "content": [{"type": "text", "text": "No."},
                                              {"type": "refusal", "refusal": "I cannot."}]}
    raw = client.chat.completions.with_raw_response.create(
        model=CHATML_MODEL, messages=[USER, refused, USER, parts, USER], max_tokens=3, user="u-1", metadata={"k": "v"},
        store=False, service_tier="auto", parallel_tool_calls=False, prompt_cache_key="c", safety_identifier="s",
        stream_options={"include_usage": True, "include_obfuscation": False})
    assert raw.http_response.status_code == 200
    named = raw.headers["warning"].split(": ", 1)[1].rstrip('"').split(", ")
    assert sorted(named) == sorted([
        "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
        "safety_identifier", "stream_options.include_obfuscation", "messages[1].refusal",
        "messages[1].annotations", "messages[3].content[1]"])


def test_completions_name_ignored_fields_too(client):
    raw = client.completions.with_raw_response.create(model=CHATML_MODEL, prompt="x", max_tokens=2, user="u")
    assert "user" in raw.headers["warning"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"extra_body": {"colour": "red"}}, "colour: unknown field"),
        ({"messages": [{**USER, "colour": "red"}]}, r"messages\.0\.colour: unknown field"),
        ({"store": "yes"}, "store"),  # ignored fields are still type-checked, without coercion
        ({"tools": [WEATHER]}, "model 'tinker-cookbook/tiny-smollm2' is served with the renderer 'chatml', "
                               "which has no tool-calling format"),
        ({"response_format": {"type": "json_object"}}, "response_format=.*no constrained decoding"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
         "response_format=.*no constrained decoding"),
        ({"functions": [{"name": "f"}]}, "deprecated form of tool calling"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"messages": [USER, {"role": "tool", "content": "22C"}]}, "without tool_call_id"),
    ],
)
def test_bad_requests_name_the_field(client, kwargs, message):
    request = {"model": CHATML_MODEL, "messages": [USER], "max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(**request)


def test_tool_choice_must_name_a_declared_tool(client):
    with pytest.raises(openai.BadRequestError, match="'get_time', which is not in tools"):
        client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})


def test_a_tool_call_comes_back_parsed_and_goes_back_as_history(client, scripted):
    scripted.script = ('<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n'
                       '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    system = {"role": "system", "content": "Be brief."}
    reply = client.chat.completions.create(model=MODEL, messages=[system, USER], tools=[WEATHER])
    prompt = _prompt_text(scripted)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")  # declared after the system prompt
    assert json.dumps(WEATHER) in prompt
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "get_weather", {"city": "Paris"})
    assert call.id.startswith("call_")
    assert choice.message.content == ""

    scripted.script = "It is 22C in Paris."
    history = [system, USER, choice.message, {"role": "tool", "tool_call_id": call.id, "content": "22C, sunny"}]
    final = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER])
    assert final.choices[0].message.content == "It is 22C in Paris."
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.tool_calls is None
    prompt = _prompt_text(scripted)
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\n22C, sunny\n</tool_response><|im_end|>") in prompt


def test_a_named_tool_choice_opens_the_reply_with_that_call(client, scripted):
    scripted.script = '{"city": "Rome"}}\n</tool_call>'  # what the model writes after the forced opening
    reply = client.chat.completions.create(
        model=MODEL, messages=[USER], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert _prompt_text(scripted).endswith(
        '<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": ')
    [call] = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Rome"})
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("renderer", "before_call"), [
    ("qwen3_disable_thinking", "<think>\n\n</think>\n\n"),  # the prompt's own empty block, not a second one
    ("qwen3_instruct", ""),  # no reasoning framing at all
])
def test_required_tool_choice_opens_the_call_in_each_qwen3_format(client, scripted, renderer, before_call):
    scripted.script = 'get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    reply = client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER], tool_choice="required",
                                           extra_body={"renderer": renderer})
    assert _prompt_text(scripted).endswith(
        f'<|im_start|>assistant\n{before_call}<tool_call>\n{{"name": "')
    [call] = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Lima"}


def test_a_streamed_reply_names_ignored_fields_too(client):
    with client.chat.completions.with_streaming_response.create(
            model=CHATML_MODEL, messages=[USER], max_tokens=2, stream=True, user="u") as response:
        assert "user" in response.headers["warning"]
        assert list(response.iter_lines())


def test_tool_choice_none_hides_the_tools(client, scripted):
    scripted.script = "Sunny."
    reply = client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER], tool_choice="none")
    assert "# Tools" not in _prompt_text(scripted)
    assert reply.choices[0].message.content == "Sunny."


def test_streamed_tool_calls(client, scripted):
    scripted.script = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    chunks = list(client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER], stream=True))
    calls = [c for chunk in chunks for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (0, "get_weather", {"city": "Oslo"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_requests_run_end_to_end_on_the_model(client):
    """Unscripted: the tiny model samples after a forced opening; whatever it writes, the reply is well formed."""
    reply = client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER], tool_choice="required",
                                           max_tokens=8, seed=0)
    assert reply.choices[0].finish_reason in ("tool_calls", "stop", "length")
    assert reply.usage.completion_tokens <= 8


def test_a_call_that_does_not_parse_stays_visible_as_text(client, scripted):
    scripted.script = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    reply = client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER])
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == scripted.script
    assert reply.choices[0].finish_reason == "stop"
