"""The server's guards: loopback unless keyed, the API key, body limits, malformed input, client disconnects.

The non-loopback rules are checked on the app itself (``create_app(host="0.0.0.0")`` driven in-process), so no
test binds anything but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from tinker_cookbook import cli
from tinker_cookbook.backends import local_backend
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.server import BackgroundServer, ServerLimits, create_app, is_loopback

MODEL = "tinker-cookbook/tiny-smollm2"
KEY = "tml-0123456789abcdef0123"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def public_app():
    """The app as it would be served on all interfaces: a key is required."""
    return TestClient(create_app(local_backend(), host="0.0.0.0", api_key=KEY))


@pytest.fixture(scope="module")
def local_app():
    return TestClient(create_app(local_backend(), limits=ServerLimits(max_body_bytes=2000)), base_url="http://localhost")


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.10", False), ("example.com", False), ("", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "my-host.example"])
def test_a_non_loopback_app_without_key_is_refused(host):
    with pytest.raises(ConfigurationError, match="needs an API key"):
        create_app(local_backend(), host=host)


def test_a_short_key_is_refused():
    with pytest.raises(ConfigurationError, match="at least 16"):
        create_app(local_backend(), host="0.0.0.0", api_key="short")


def test_missing_and_bad_keys_get_401(public_app):
    missing = public_app.get("/v1/models")
    assert missing.status_code == 401
    assert "missing API key" in missing.json()["error"]["message"]
    assert missing.headers["www-authenticate"] == "Bearer"
    for headers in ({"Authorization": "Bearer " + KEY[:-1] + "x"}, {"X-API-Key": "nope"},
                    {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        bad = public_app.get("/v1/models", headers=headers)
        assert bad.status_code == 401, headers
        assert bad.json()["error"]["type"] == "authentication_error"
    # refused before the body is read: even a malformed request gets 401, not 400
    assert public_app.post("/v1/chat/completions", content=b"{oops").status_code == 401


def test_the_key_works_in_either_header(public_app):
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"X-API-Key": KEY}):
        response = public_app.get("/v1/models", headers=headers)
        assert response.status_code == 200, headers
        assert MODEL in [m["id"] for m in response.json()["data"]]


def test_loopback_needs_no_key(local_app):
    assert local_app.get("/v1/models").status_code == 200


def test_oversize_bodies_get_413(local_app):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    response = local_app.post("/v1/chat/completions", json=big)
    assert response.status_code == 413
    assert "limit of 2000 bytes" in response.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit holds on the bytes actually received
        for _ in range(10):
            yield b" " * 500

    assert local_app.post("/v1/chat/completions", content=chunks(),
                          headers={"Content-Type": "application/json"}).status_code == 413


@pytest.mark.parametrize(("body", "status", "message"), [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (json.dumps({**CHAT, "n": "many"}).encode(), 400, "n: Input should be a valid integer"),
    (json.dumps({"messages": CHAT["messages"]}).encode(), 400, "model: required field missing"),
    (json.dumps({**CHAT, "messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "messages.0.role"),
    (json.dumps({**CHAT, "messages": []}).encode(), 400, "messages"),
    (json.dumps({**CHAT, "model": "no/such-model"}).encode(), 404, "not served here"),
])
def test_malformed_requests_get_4xx_with_clear_bodies(local_app, body, status, message):
    response = local_app.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status


def test_unknown_routes_and_methods_get_json_errors(local_app):
    missing = local_app.get("/v2/anything")
    assert missing.status_code == 404 and "no route" in missing.json()["error"]["message"]
    assert local_app.get("/v1/chat/completions").status_code == 405


def _asgi_stream_then_disconnect(app) -> tuple[list[bytes], list[dict]]:
    """Drive a streamed chat request through the app and disconnect after the first event."""
    body = json.dumps({**CHAT, "max_tokens": 16, "n": 4, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json"),
                                                               (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent: list[dict] = []
    events: list[bytes] = []

    async def run() -> None:
        first_event = asyncio.Event()
        requested = False

        async def receive() -> dict:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": body, "more_body": False}
            await first_event.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                events.append(message["body"])
                first_event.set()
                await asyncio.sleep(0.01)  # let the disconnect arrive before the next event

        await app(scope, receive, send)

    asyncio.run(run())
    return events, sent


def test_a_client_disconnect_mid_stream_leaves_the_server_serving():
    app = create_app(local_backend())
    events, sent = _asgi_stream_then_disconnect(app)
    assert sent[0]["status"] == 200
    assert events and b"[DONE]" not in b"".join(events), "the stream should have been cut before its end"
    # the same app (and engine) answers the next request, over a real connection too
    with BackgroundServer(app) as server:
        with httpx.Client(base_url=server.url) as http:
            with http.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 16, "n": 8,
                                                                   "stream": True}) as response:
                next(response.iter_lines())  # read one event, then hang up
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
        reply = client.chat.completions.create(**CHAT)
        assert reply.choices[0].message.role == "assistant"


def test_openai_client_against_a_keyed_server():
    with BackgroundServer(create_app(local_backend(), api_key=KEY)) as server:
        good = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        assert MODEL in [m.id for m in good.models.list().data]
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="tml-wrong-key-0000000000", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="invalid API key"):
            bad.models.list()


def test_serve_command_refuses_a_public_bind_without_key(capsys, monkeypatch):
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    monkeypatch.setenv("TINKER_COOKBOOK_NO_REEXEC", "1")  # a restart for the malloc settings would replace pytest
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "needs an API key" in capsys.readouterr().err


def test_serve_command_prints_url_models_and_key_status():
    """``tinker-cookbook serve`` in a subprocess on a free loopback port: the banner, then a working request."""
    command = [sys.executable, "-m", "tinker_cookbook.cli", "serve", "--port", "0", "--generate-api-key",
               "--model", MODEL]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("  API key:"):
                break
        banner = "".join(lines)
        assert "listening on http://127.0.0.1:" in banner and "this machine only" in banner
        assert f"{MODEL} (loaded)" in banner and "tinker-cookbook/tiny-qwen3" in banner
        key = banner.split("API key:")[1].split()[0]
        assert key.startswith("tml-")
        url = banner.split("listening on ")[1].split()[0]
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        assert client.chat.completions.create(**CHAT).choices[0].message.role == "assistant"
    finally:
        process.terminate()
        process.wait(timeout=60)
