"""The Inspect model provider: config mapping, stop handling, message conversion and error reporting."""

from __future__ import annotations

import asyncio

import pytest
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ContentAudio,
    GenerateConfig,
    Model,
    get_model,
)
from inspect_ai.tool import ToolCall, ToolInfo, ToolParams

from tinker_cookbook import renderers, tinker
from tinker_cookbook.eval.inspect_utils import (
    PROVIDER_NAME,
    InspectAPIFromTinkerSampling,
    inspect_messages_to_renderer,
    merge_stop_sequences,
    sampling_params_from_config,
    sequence_to_choice,
)
from tinker_cookbook.exceptions import ConfigurationError, RendererError
from tinker_cookbook.tokenizer_utils import get_tokenizer

TINY = "tinker-cookbook/tiny-smollm2"
TINY_QWEN3 = "tinker-cookbook/tiny-qwen3"
IM_END = 2  # <|im_end|> in the SmolLM2 tokenizer, chatml's stop token


@pytest.fixture(scope="module")
def sampling_client() -> tinker.SamplingClient:
    return tinker.ServiceClient().create_sampling_client(base_model=TINY)


@pytest.fixture(scope="module")
def api(sampling_client) -> InspectAPIFromTinkerSampling:
    return InspectAPIFromTinkerSampling(model_name=TINY, renderer_name="chatml", sampling_client=sampling_client)


def _generate(model: Model, prompt: str, **config) -> object:
    return asyncio.run(model.generate([ChatMessageUser(content=prompt)], config=GenerateConfig(**config)))


# -- GenerateConfig -> SamplingParams -------------------------------------------------------------------------


def test_config_fields_map_to_sampling_params():
    config = GenerateConfig(temperature=0.3, max_tokens=7, top_p=0.9, top_k=5, seed=11)
    params = sampling_params_from_config(config, [IM_END])
    assert (params.temperature, params.max_tokens, params.top_p, params.top_k, params.seed, params.stop) == (
        0.3, 7, 0.9, 5, 11, [IM_END])


def test_unset_config_fields_take_the_api_defaults():
    params = sampling_params_from_config(GenerateConfig(), ["\n\nUser:"])
    defaults = tinker.SamplingParams()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed) == (
        defaults.temperature, defaults.top_p, defaults.top_k, None, None)


def test_seed_and_num_choices_reach_the_sampler(api):
    model = Model(api, GenerateConfig())
    first = _generate(model, "Hello", temperature=1.0, max_tokens=6, seed=3, num_choices=2)
    again = _generate(model, "Hello", temperature=1.0, max_tokens=6, seed=3, num_choices=2)
    assert len(first.choices) == 2
    assert [c.message.text for c in first.choices] == [c.message.text for c in again.choices]
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0


def test_max_tokens_limits_the_reply(api):
    output = _generate(Model(api, GenerateConfig()), "Hello", temperature=0.0, max_tokens=3)
    assert output.usage.output_tokens <= 3
    # a reply cut at the limit is reported as such (one ended by the stop token would be shorter)
    assert output.stop_reason == ("max_tokens" if output.usage.output_tokens == 3 else "stop")


# -- stop sequences ---------------------------------------------------------------------------------------


def test_renderer_token_stops_are_kept_as_ids_without_inspect_stops():
    tokenizer = get_tokenizer(TINY)
    assert merge_stop_sequences([IM_END], [], tokenizer) == [IM_END]


def test_inspect_stops_join_token_stops_as_their_special_token_text():
    tokenizer = get_tokenizer(TINY)
    assert merge_stop_sequences([IM_END], ["###"], tokenizer) == ["<|im_end|>", "###"]
    assert merge_stop_sequences(["\n\nUser:"], ["###", ""], tokenizer) == ["\n\nUser:", "###"]


def test_choice_text_ends_before_an_inspect_stop_string():
    tokenizer = get_tokenizer(TINY)
    renderer = renderers.get_renderer("chatml", tokenizer)
    tokens = tokenizer.encode("Name: Ada\n###tail", add_special_tokens=False)
    sequence = tinker.SampledSequence(stop_reason="stop", tokens=tokens)
    choice = sequence_to_choice(renderer, sequence, ["###"], "m")
    assert (choice.message.text, choice.stop_reason) == ("Name: Ada\n", "stop")


def test_choice_stop_reasons_from_the_renderer_stop_and_the_token_limit():
    tokenizer = get_tokenizer(TINY)
    renderer = renderers.get_renderer("chatml", tokenizer)
    body = tokenizer.encode("Name: Ada", add_special_tokens=False)
    stopped = sequence_to_choice(renderer, tinker.SampledSequence(stop_reason="stop", tokens=[*body, IM_END]), [], "m")
    cut = sequence_to_choice(renderer, tinker.SampledSequence(stop_reason="length", tokens=body), [], "m")
    assert (stopped.message.text, stopped.stop_reason) == ("Name: Ada", "stop")
    assert (cut.message.text, cut.stop_reason) == ("Name: Ada", "max_tokens")


def test_sampler_stops_at_an_inspect_stop_string(api):
    model = Model(api, GenerateConfig())
    # the tiny random model's greedy reply is all newlines; a seeded sample is varied and reproducible
    settings = dict(temperature=1.0, seed=5, max_tokens=24)
    free_output = _generate(model, "Tell me a story", **settings)
    free = free_output.completion
    # a two-character stop string taken from the middle of the reply, at its first occurrence
    starts = [k for k in range(2, len(free) - 2) if free[k:k + 2].strip() and free.find(free[k:k + 2]) == k]
    assert starts, f"the reply {free!r} has no usable stop string"
    stop = free[starts[0]:starts[0] + 2]
    stopped = _generate(model, "Tell me a story", stop_seqs=[stop], **settings)
    assert stopped.completion == free[: starts[0]]
    assert stopped.stop_reason == "stop"
    # the sampler itself stopped there (not only the text cut afterwards): fewer tokens were generated
    assert stopped.usage.output_tokens < free_output.usage.output_tokens


# -- messages and tools -----------------------------------------------------------------------------------


def test_inspect_messages_render_like_the_same_renderer_messages():
    tokenizer = get_tokenizer(TINY_QWEN3)
    renderer = renderers.get_renderer("qwen3_instruct", tokenizer)
    inspect_messages = [
        ChatMessageSystem(content="Be brief."),
        ChatMessageUser(content="Weather in Oslo?"),
        ChatMessageAssistant(content="", tool_calls=[ToolCall(id="c1", function="weather", arguments={"city": "Oslo"})]),
        ChatMessageTool(content="rain", tool_call_id="c1", function="weather"),
    ]
    expected: list[renderers.Message] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [renderers.ToolCall(
            id="c1", function=renderers.FunctionBody(name="weather", arguments='{"city": "Oslo"}'))]},
        {"role": "tool", "content": "rain", "tool_call_id": "c1", "name": "weather"},
    ]
    converted = inspect_messages_to_renderer(inspect_messages)
    assert converted == expected
    assert (renderer.build_generation_prompt(converted).to_ints()
            == renderer.build_generation_prompt(expected).to_ints())


def test_tools_are_declared_through_the_renderer():
    sampling_client = tinker.ServiceClient().create_sampling_client(base_model=TINY_QWEN3)
    api = InspectAPIFromTinkerSampling(renderer_name="qwen3_instruct", sampling_client=sampling_client)
    tool = ToolInfo(name="weather_lookup", description="Current weather", parameters=ToolParams())
    messages = [ChatMessageSystem(content="Be brief."), ChatMessageUser(content="Weather in Oslo?")]
    text = api.tokenizer.decode(api.build_prompt(messages, [tool]).to_ints())
    assert "weather_lookup" in text and "Be brief." in text
    assert "weather_lookup" not in api.tokenizer.decode(api.build_prompt(messages, [tool], "none").to_ints())


def test_unsupported_content_is_a_renderer_error():
    message = ChatMessageUser(content=[ContentAudio(audio="x.wav", format="wav")])
    with pytest.raises(RendererError, match="'audio'"):
        inspect_messages_to_renderer([message])


# -- construction and errors ------------------------------------------------------------------------------


def test_provider_resolves_base_model_and_default_renderer():
    model = get_model(f"{PROVIDER_NAME}/{TINY}", memoize=False)
    assert model.api.renderer_name == "chatml" and model.api.base_model == TINY
    assert str(model) == f"{PROVIDER_NAME}/{TINY}"
    assert _generate(model, "Hi", temperature=0.0, max_tokens=2).usage.output_tokens >= 1


def test_model_args_pick_the_renderer():
    model = get_model(f"{PROVIDER_NAME}/{TINY}", memoize=False, renderer_name="role_colon")
    assert isinstance(model.api.renderer, renderers.RoleColonRenderer)


def test_directly_built_api_works_as_an_inspect_model(api):
    # the docs build the API themselves and wrap it in Model (e.g. as a grader)
    model = Model(api=api, config=GenerateConfig())
    assert str(model) == f"{PROVIDER_NAME}/{TINY}"
    assert len(_generate(model, "Hi", temperature=0.0, max_tokens=2).choices) == 1


def test_unknown_model_path_is_a_clear_error():
    path = "tinker://no-such-run/sampler_weights/final"
    with pytest.raises(ConfigurationError, match="no-such-run") as info:
        get_model(f"{PROVIDER_NAME}/{path}", memoize=False)
    assert path in str(info.value) and "sampler_path" in str(info.value)


def test_unknown_base_model_is_a_clear_error():
    with pytest.raises(ConfigurationError, match=r"'NoSuchOrg/NoSuchModel-1B'.*not available"):
        get_model(f"{PROVIDER_NAME}/NoSuchOrg/NoSuchModel-1B", memoize=False)


def test_bad_model_args_are_clear_errors(sampling_client):
    with pytest.raises(ConfigurationError, match=r"unknown model args .*\['renderer'\]"):
        InspectAPIFromTinkerSampling(model_name=TINY, renderer="chatml", sampling_client=sampling_client)
    with pytest.raises(ConfigurationError, match="not a tinker:// path"):
        InspectAPIFromTinkerSampling(model_path="runs/x/final", sampling_client=sampling_client)
    with pytest.raises(ConfigurationError, match="needs sampling_client, model_path or model_name"):
        InspectAPIFromTinkerSampling()
    with pytest.raises(RendererError, match="unknown renderer name 'nope'"):
        InspectAPIFromTinkerSampling(renderer_name="nope", sampling_client=sampling_client)
