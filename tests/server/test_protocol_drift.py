"""The remote backend against servers of an older Tinker protocol (stubs that answer as older servers do): one
without the client-config route cannot be reached, and the error says why and which SDK range works; on one that
has the route, training works, sampling fails with an error that names what is missing and the SDK range that
works, and resuming falls back to creating the client and loading the checkpoint."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from server_utils import serve

from tinker_cookbook import tinker
from tinker_cookbook.tinker import errors, types

MODEL = "tinker-cookbook/tiny-smollm2"
TIMEOUT_S = 120

Scope = dict[str, Any]


class OlderProtocol:
    """ASGI middleware over this project's Tinker routes that answers as an older server does:

    - ``/api/v1/asample`` futures carry no ``sample_sequence_ids``;
    - ``/api/v1/load_weights`` requires ``model_id`` (422 in FastAPI's validation format without it), so the
      SDK's one-request create-and-load is refused;
    - there is no ``/api/v1/weights_info`` route (404).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in ("/api/v1/asample", "/api/v1/load_weights",
                                                   "/api/v1/weights_info"):
            return await self.app(scope, receive, send)
        if path == "/api/v1/weights_info":
            return await _json(send, 404, {"detail": "Not Found"})
        body = await _read_body(receive)

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        if path == "/api/v1/load_weights":
            request = json.loads(body or b"{}")
            if not request.get("model_id"):
                return await _json(send, 422, {"detail": [{"type": "missing", "loc": ["body", "model_id"],
                                                           "msg": "Field required", "input": request}]})
            return await self.app(scope, replay, send)
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answer = json.loads(b"".join(chunks))
                answer.pop("sample_sequence_ids", None)
                await _json(send, start["status"], answer)

        await self.app(scope, replay, capture)


class NoClientConfig:
    """ASGI middleware that removes ``/api/v1/client/config`` (404), as SkyRL-tx 0.3.0 has no such route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") == "/api/v1/client/config":
            return await _json(send, 404, {"detail": "Not Found"})
        return await self.app(scope, receive, send)


class JsonResults:
    """ASGI middleware that answers in JSON where the server sends a protobuf result (as servers older than the
    SDK's protobuf results do): the SDK then fails before it reads the payload, so any JSON object will do."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != "/api/v1/retrieve_future":
            return await self.app(scope, receive, send)
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            if b"protobuf" in dict(start.get("headers", [])).get(b"content-type", b""):
                return await _json(send, start["status"], {"type": "sample", "sequences": []})
            await send({**start, "type": "http.response.start"})
            await send({"type": "http.response.body", "body": b"".join(chunks)})

        await self.app(scope, receive, capture)


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _json(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _app(server_backend: Any) -> Any:
    import fastapi

    from tinker_cookbook.server.tinker_api import build_router

    app = fastapi.FastAPI()
    app.include_router(build_router(server_backend))
    return app


@pytest.fixture(scope="module")
def older_server(server_backend: Any) -> Iterator[str]:
    yield from serve(OlderProtocol(_app(server_backend)))


def test_a_server_without_client_config_is_named_with_the_sdk_range_that_reaches_it(server_backend: Any) -> None:
    for url in serve(NoClientConfig(_app(server_backend))):
        with pytest.raises(errors.NotFoundError) as caught:
            tinker.ServiceClient(base_url=url)
        message = str(caught.value)
        assert url in message and "no /api/v1/client/config route" in message
        assert "older Tinker protocol" in message and "tinker<=0.16.1" in message


def test_json_results_name_the_protocol_and_the_sdk_range_that_reads_them(server_backend: Any) -> None:
    for url in serve(JsonResults(_app(server_backend))):
        client = tinker.ServiceClient(base_url=url).create_lora_training_client(MODEL, rank=4, seed=5)
        with pytest.raises(errors.APIResponseValidationError) as caught:
            client.forward_backward(DATA, "cross_entropy").result(timeout=TIMEOUT_S)
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=TIMEOUT_S)  # JSON results still work
        sampler = client.save_weights_and_get_sampling_client()
        with pytest.raises(errors.APIResponseValidationError) as caught_sampling:
            sampler.sample(types.ModelInput.from_ints([1, 5]), 1,
                           types.SamplingParams(max_tokens=2, temperature=0.0)).result(timeout=TIMEOUT_S)
        for message in (str(caught.value), str(caught_sampling.value)):
            assert url in message and "sent a result as JSON" in message
            assert "older Tinker protocol" in message and "tinker<=0.24.1" in message


DATA = [types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9, 14, 3]),
                    loss_fn_inputs={"target_tokens": [5, 9, 14, 3, 8], "weights": [1.0] * 5})]


def trained_client(url: str) -> Any:
    client = tinker.ServiceClient(base_url=url).create_lora_training_client(MODEL, rank=4, seed=5)
    client.forward_backward(DATA, "cross_entropy").result(timeout=TIMEOUT_S)
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=TIMEOUT_S)
    return client


def test_training_works_and_sampling_says_what_is_missing_and_which_sdk_works(older_server: str) -> None:
    client = trained_client(older_server)
    sampler = client.save_weights_and_get_sampling_client()
    with pytest.raises(errors.APIResponseValidationError) as caught:
        sampler.sample(types.ModelInput.from_ints([1, 5]), 1,
                       types.SamplingParams(max_tokens=2, temperature=0.0)).result(timeout=TIMEOUT_S)
    message = str(caught.value)
    assert older_server in message
    assert "without sample_sequence_ids" in message
    assert "tinker<=0.25.0" in message and "older Tinker protocol" in message


def test_resume_falls_back_to_create_then_load(older_server: str, caplog: pytest.LogCaptureFixture) -> None:
    client = trained_client(older_server)
    path = client.save_state("drift").result(timeout=TIMEOUT_S).path
    expected = client.forward(DATA, "cross_entropy").result(timeout=TIMEOUT_S).loss_fn_outputs[0]["logprobs"].data
    service = tinker.ServiceClient(base_url=older_server)
    with caplog.at_level(logging.WARNING, logger="tinker_cookbook.tinker._remote"):
        resumed = service.create_training_client_from_state_with_optimizer(path)
    assert "resumed by creating the client and then loading the checkpoint" in caplog.text
    got = resumed.forward(DATA, "cross_entropy").result(timeout=TIMEOUT_S).loss_fn_outputs[0]["logprobs"].data
    assert got == expected  # the same weights, loaded by the server itself
    # The Adam state came along: both clients take the same next step.
    steps = [c.forward_backward(DATA, "cross_entropy").result(timeout=TIMEOUT_S) and
             (c.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=TIMEOUT_S).metrics or {})["step"]
             for c in (client, resumed)]
    assert steps == [2.0, 2.0]


def test_resume_of_an_unknown_checkpoint_names_the_protocol_and_the_sdk_range(older_server: str) -> None:
    service = tinker.ServiceClient(base_url=older_server)
    with pytest.raises(errors.BadRequestError) as caught:
        service.create_training_client_from_state("tinker://no-such-run/weights/none")
    message = str(caught.value)
    assert "older Tinker protocol" in message and "tinker<=0.24.0" in message
