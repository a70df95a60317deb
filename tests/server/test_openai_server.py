"""The OpenAI-compatible routes, through the official ``openai`` client against a real server on a tiny model.

Each result is compared with the in-process ``SamplingClient`` doing the same request with the same seed. The
requests run one at a time, so each is alone in the sampler's batch and the two paths compute bit-identical
logits: equal seeds must then give equal tokens (see ``engine/sampling/sampler.py`` on seeds).
"""

from __future__ import annotations

import openai
import pytest

from tinker_cookbook import renderers, tinker
from tinker_cookbook.backends import local_backend
from tinker_cookbook.server import BackgroundServer, create_app
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"  # chatml renderer (stop token <|im_end|>), 49k vocabulary
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(local_backend())) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused-on-loopback", max_retries=0)


@pytest.fixture(scope="module")
def in_process(service) -> tinker.SamplingClient:
    return service.create_sampling_client(base_model=MODEL)


def _chat_in_process(sampler: tinker.SamplingClient, messages: list[dict], **params) -> list[renderers.Message]:
    renderer = renderers.get_renderer("chatml", sampler.get_tokenizer())
    prompt = renderer.build_generation_prompt([renderers.Message(role=m["role"], content=m["content"])
                                               for m in messages])
    n = params.pop("n", 1)
    response = sampler.sample(prompt, n, types.SamplingParams(stop=renderer.get_stop_sequences(), **params)).result()
    return [renderer.parse_response(seq.tokens)[0] for seq in response.sequences]


def test_model_list(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids and "tinker-cookbook/tiny-qwen3" in ids
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no/such-model")


def test_completions_equal_the_in_process_sampler(client, in_process):
    prompt = "The capital of France is"
    result = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, n=2, seed=11, logprobs=0)
    tokenizer = in_process.get_tokenizer()
    expected = in_process.sample(types.ModelInput.from_ints(tokenizer.encode(prompt)), 2,
                                 types.SamplingParams(max_tokens=6, seed=11)).result()
    assert [c.index for c in result.choices] == [0, 1]
    for choice, seq in zip(result.choices, expected.sequences, strict=True):
        assert choice.text == tokenizer.decode(seq.tokens)
        assert choice.finish_reason == "length"
        assert choice.logprobs.token_logprobs == pytest.approx(seq.logprobs, abs=0, rel=0)  # same computation
        assert "".join(choice.logprobs.tokens) == choice.text
    assert result.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert result.usage.completion_tokens == 12


def test_completions_stop_at_a_user_stop_string(client):
    # Greedy, so the second request continues exactly like the first until the stop string.
    free = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    text = free.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    stopped = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0,
                                        stop=[stop])
    assert stopped.choices[0].text == text[: text.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_batch_of_prompts_and_token_prompts(client, in_process):
    tokens = in_process.get_tokenizer().encode("Hello there")
    result = client.completions.create(model=MODEL, prompt=["a b c", "d e f", "g h"], max_tokens=2, n=2)
    assert sorted(c.index for c in result.choices) == list(range(6))
    by_ids = client.completions.create(model=MODEL, prompt=tokens, max_tokens=3, seed=4)
    by_text = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=3, seed=4)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_chat_equals_the_renderer_in_process(client, in_process):
    result = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, seed=5, n=2,
                                            logprobs=True)
    expected = _chat_in_process(in_process, MESSAGES, max_tokens=10, seed=5, n=2)
    assert [c.message.content for c in result.choices] == [renderers.get_text_content(m) for m in expected]
    for choice in result.choices:
        assert choice.message.role == "assistant"
        assert choice.finish_reason in ("stop", "length")
        assert all(entry.logprob <= 0 for entry in choice.logprobs.content)


def test_chat_stream_equals_the_plain_response(client):
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=9, n=2)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=9, n=2,
                                            stream=True, stream_options={"include_usage": True})
    content = {0: "", 1: ""}
    finish = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert [content[0], content[1]] == [c.message.content for c in plain.choices]
    assert [finish[0], finish[1]] == [c.finish_reason for c in plain.choices]
    assert usage is not None and usage.total_tokens == plain.usage.total_tokens


def test_completions_stream(client):
    plain = client.completions.create(model=MODEL, prompt="One two three", max_tokens=8, seed=2)
    pieces = [c.choices[0].text for c in client.completions.create(model=MODEL, prompt="One two three",
                                                                    max_tokens=8, seed=2, stream=True)
              if c.choices]
    assert "".join(pieces) == plain.choices[0].text and len(pieces) >= 2


def test_chat_user_stop_and_renderer_choice(client):
    free = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    text = free.choices[0].message.content
    stop = text[len(text) // 2: len(text) // 2 + 2]
    stopped = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
                                             stop=stop)
    assert stopped.choices[0].message.content == text[: text.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    other = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3,
                                           extra_body={"renderer": "role_colon"})
    assert other.choices[0].message.role == "assistant"
    with pytest.raises(openai.BadRequestError, match="unknown renderer name 'nope'"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"renderer": "nope"})


def test_sampler_checkpoint_by_tinker_path(client, service):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    tokens = list(range(100, 120))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs=dict(target_tokens=tokens[1:], weights=[1.0] * (len(tokens) - 1)))
    tc.forward_backward([datum], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=0.05))
    path = tc.save_weights_for_sampler("served").result().path
    result = client.chat.completions.create(model=path, messages=MESSAGES, max_tokens=8, seed=3)
    expected = _chat_in_process(service.create_sampling_client(model_path=path), MESSAGES, max_tokens=8, seed=3)
    assert result.choices[0].message.content == renderers.get_text_content(expected[0])
    assert result.model == path
    assert path in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=path.replace("served", "missing"), messages=MESSAGES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 17}, "n=17 is above this server's limit of 16"),
        ({"presence_penalty": 0.5}, "presence_penalty=0.5 is not supported"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs=2 is not supported"),
        ({"temperature": -1}, "temperature"),
        ({"extra_body": {"colour": "red"}}, "colour: unknown field"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "no tool-calling format"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "only text parts"),
        ({"max_tokens": 10**6}, "exceeds the context window"),
    ],
)
def test_chat_bad_requests_get_400(client, kwargs, message):
    request = {"model": MODEL, "messages": MESSAGES, **kwargs}
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(**request)


def test_completion_bad_requests_get_400(client):
    with pytest.raises(openai.BadRequestError, match="logprobs=2 is not supported"):
        client.completions.create(model=MODEL, prompt="x", logprobs=2)
    with pytest.raises(openai.BadRequestError, match="echo=True is not supported"):
        client.completions.create(model=MODEL, prompt="x", echo=True)
    with pytest.raises(openai.BadRequestError, match="outside the model's vocabulary"):
        client.completions.create(model=MODEL, prompt=[10**7])
    with pytest.raises(openai.BadRequestError, match="samples is above"):
        client.completions.create(model=MODEL, prompt=["a"] * 9, n=8)


def test_inspect_ai_through_its_openai_provider(server, monkeypatch, tmp_path):
    """Inspect's ``openai-api/<name>/<model>`` provider evaluates a task against the server."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    monkeypatch.setenv("COOKBOOK_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("COOKBOOK_API_KEY", "unused-on-loopback")
    task = Task(dataset=[Sample(input="Say hi", target="hi"), Sample(input="Name a colour", target="red")],
                solver=generate(), scorer=includes())
    [log] = inspect_eval(task, model=f"openai-api/cookbook/{MODEL}", log_dir=str(tmp_path), display="none",
                         max_tokens=6, seed=1)
    assert log.status == "success", log.error
    assert all(sample.output.completion for sample in log.samples)
