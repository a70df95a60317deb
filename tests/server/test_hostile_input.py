"""Hostile input against the whole app (OpenAI and Tinker routes behind the header checks): every bad value gets a
4xx naming its field, a bad request never fails its batch neighbours, and no answer shows a path of the machine."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_utils import assert_public

from tinker_cookbook import tinker
from tinker_cookbook.backends import local_backend
from tinker_cookbook.server import BackgroundServer, create_app, guards
from tinker_cookbook.server.json_input import MAX_JSON_DEPTH

MODEL = "tinker-cookbook/tiny-smollm2"
JSON = {"Content-Type": "application/json"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3}
PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(local_backend())


@pytest.fixture(scope="module")
def client(app: Any) -> TestClient:
    return TestClient(app, base_url="http://localhost", raise_server_exceptions=False)


@pytest.fixture(scope="module")
def server(app: Any) -> Any:
    with BackgroundServer(app) as running:
        yield running


def error_message(response: httpx.Response) -> str:
    body = response.json()
    return body["error"]["message"] if "error" in body and isinstance(body["error"], dict) else body["detail"]


def nested(depth: int) -> bytes:
    return b'{"model": ' + b"[" * depth + b"]" * depth + b"}"


# -- one bad request in a batch ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("top_k", "status"), [(2**64, 400), (2**63, 400), (2**62, 200)])
def test_a_bad_request_never_fails_the_valid_ones_sent_with_it(server: Any, top_k: int, status: int) -> None:
    """Eleven valid completions and one with a huge top_k, all at once: the sampler batches them together. Out of
    the 64-bit range the bad one is refused by name; within it, a top_k beyond the vocabulary means no cut."""
    bodies = [{**COMPLETION, "seed": i} for i in range(11)]
    bodies.insert(5, {**COMPLETION, "top_k": top_k})
    with httpx.Client(base_url=server.url, timeout=120) as http, \
            concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: http.post("/v1/completions", json=body), bodies))
    bad = answers.pop(5)
    assert bad.status_code == status, bad.text
    if status == 400:
        assert "top_k" in error_message(bad)
    assert [a.status_code for a in answers] == [200] * 11, [a.text for a in answers if a.status_code != 200]


# -- 4xx naming the field ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("route", "body", "field"), [
    ("/v1/completions", json.dumps({**COMPLETION, "top_k": 2**63}).encode(), "top_k"),
    ("/v1/chat/completions", json.dumps({**CHAT, "top_k": 2**64}).encode(), "top_k"),
    ("/v1/completions", json.dumps({**COMPLETION, "seed": -(2**63) - 1}).encode(), "seed"),
    ("/v1/completions", nested(50_000), "nests deeper"),
    ("/v1/chat/completions", nested(100_000), "nests deeper"),
    ("/v1/completions", nested(MAX_JSON_DEPTH + 5), "model"),
    ("/v1/completions", json.dumps({**COMPLETION, "prompt": "a\ud800b"}).encode(), "prompt"),
    ("/v1/completions", json.dumps({**COMPLETION, "prompt": ["ok", "\udc00"]}).encode(), "prompt[1]"),
    ("/v1/chat/completions", json.dumps({**CHAT, "messages": [{"role": "user", "content": "x\udfff"}]}).encode(),
     "messages[0].content"),
    ("/v1/completions", json.dumps({**COMPLETION, "n": "2"}).encode(), "n"),
    ("/v1/completions", json.dumps({**COMPLETION, "max_tokens": True}).encode(), "max_tokens"),
    ("/v1/chat/completions", json.dumps({**CHAT, "logprobs": "true"}).encode(), "logprobs"),
    ("/v1/chat/completions", json.dumps({**CHAT, "temperature": "0.5"}).encode(), "temperature"),
    ("/v1/completions", json.dumps({**COMPLETION, "temperature": 1e-40, "logprobs": 0}).encode(), "temperature"),
    ("/api/v1/asample", json.dumps({"prompt": PROMPT, "base_model": MODEL,
                                    "sampling_params": {"max_tokens": 2, "top_k": 2**63}}).encode(), "top_k"),
    ("/api/v1/asample", json.dumps({"prompt": PROMPT, "base_model": MODEL, "num_samples": "2",
                                    "sampling_params": {"max_tokens": 2}}).encode(), "num_samples"),
    ("/api/v1/asample", json.dumps({"prompt": PROMPT, "base_model": MODEL,
                                    "sampling_params": {"max_tokens": "2"}}).encode(), "max_tokens"),
    ("/api/v1/asample", json.dumps({"prompt": PROMPT, "base_model": MODEL, "prompt_logprobs": "true",
                                    "sampling_params": {"max_tokens": 2}}).encode(), "prompt_logprobs"),
    ("/api/v1/create_session", nested(60_000).replace(b'"model"', b'"tags"'), "nests deeper"),
    ("/api/v1/create_session", json.dumps({"tags": ["\ud800"]}).encode(), "tags[0]"),
])
def test_bad_values_get_a_400_naming_the_field(client: TestClient, route: str, body: bytes, field: str) -> None:
    answer = client.post(route, content=body, headers=JSON)
    assert answer.status_code == 400, answer.text
    assert field in error_message(answer)
    assert_public(answer)


def wait_future(client: TestClient, answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    request_id = answer.json()["request_id"]
    for _ in range(60):
        result = client.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
        if result.get("type") != "try_again":
            return result
    raise AssertionError("the future never finished")


def new_session(client: TestClient) -> str:
    return client.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]


def test_a_huge_lora_rank_is_refused_and_leaves_no_run(client: TestClient) -> None:
    before = client.get("/api/v1/training_runs?limit=1000").json()["training_runs"]
    answer = client.post("/api/v1/create_model", json={"session_id": new_session(client), "model_seq_id": 0,
                                                       "base_model": MODEL, "lora_config": {"rank": 10**13}})
    failed = wait_future(client, answer)
    assert failed["category"] == "user" and "lora_config.rank=10000000000000" in failed["error"]
    assert "hidden size of 64" in failed["error"]
    assert client.get("/api/v1/training_runs?limit=1000").json()["training_runs"] == before


def test_a_create_that_fails_while_building_the_client_leaves_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank within bounds whose adapter still cannot be built (out of memory, say): no run stays listed."""
    from tinker_cookbook.engine import backend as engine_backend

    def no_memory(*args: Any, **kwargs: Any) -> None:
        raise MemoryError("cannot allocate the adapter")

    monkeypatch.setattr(engine_backend, "TrainingSession", no_memory)
    rest = tinker.ServiceClient().create_rest_client()
    before = rest.list_training_runs(limit=1000).result().training_runs
    with pytest.raises(tinker.APIError, match="cannot allocate"):
        tinker.ServiceClient().create_lora_training_client(MODEL, rank=8)
    assert rest.list_training_runs(limit=1000).result().training_runs == before


def test_huge_ttls_are_refused_by_name(client: TestClient) -> None:
    created = wait_future(client, client.post("/api/v1/create_model", json={
        "session_id": new_session(client), "model_seq_id": 0, "base_model": MODEL, "lora_config": {"rank": 2}}))
    model_id = created["model_id"]
    answer = client.post("/api/v1/save_weights_for_sampler", json={"model_id": model_id, "path": "a",
                                                                   "ttl_seconds": 10**30})
    assert answer.status_code == 400 and "ttl_seconds" in error_message(answer)
    # Within 64 bits but beyond any date: refused by the store, through the future.
    failed = wait_future(client, client.post("/api/v1/save_weights_for_sampler", json={
        "model_id": model_id, "path": "b", "ttl_seconds": 10**15}))
    assert failed["category"] == "user" and "ttl_seconds=1000000000000000" in failed["error"]
    assert "100 years" in failed["error"]


def test_a_symlink_planted_in_the_store_is_a_clear_4xx_without_paths(client: TestClient, tmp_path: Path) -> None:
    runs = local_backend().store.runs_dir
    runs.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "run.json").write_text("{}")
    planted = runs / "planted-run"
    planted.symlink_to(elsewhere, target_is_directory=True)
    try:
        tinker_route = client.get("/api/v1/training_runs/planted-run")
        openai_route = client.post("/v1/completions", json={**COMPLETION,
                                                           "model": "tinker://planted-run/sampler_weights/x"})
    finally:
        planted.unlink()
    for answer in (tinker_route, openai_route):
        assert 400 <= answer.status_code < 500, answer.text
        assert "symlink" in error_message(answer) and "<store>" in error_message(answer)
        assert_public(answer)


# -- what answers show ----------------------------------------------------------------------------------------------

def test_not_found_answers_name_no_machine_path(client: TestClient) -> None:
    answers = [
        client.post("/v1/chat/completions", json={**CHAT, "model": "tinker://no-such-run/sampler_weights/x"}),
        client.post("/v1/chat/completions", json={**CHAT, "model": "Qwen/Qwen3-8B"}),
        client.get("/api/v1/training_runs/no-such-run"),
        client.post("/api/v1/asample", json={"prompt": PROMPT, "sampling_params": {"max_tokens": 1},
                                             "base_model": "Qwen/Qwen3-8B"}),
        client.post("/api/v1/weights_info", json={"tinker_path": "tinker://no-such-run/weights/x"}),
    ]
    for answer in answers:
        assert answer.status_code == 404, answer.text
        assert_public(answer)


def test_a_bug_answers_500_with_its_class_only(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from tinker_cookbook.server.openai_routes import completions

    secret = f"{local_backend().store.root}/runs/x and {Path.home()}/.cache/y"

    def broken(*args: Any) -> None:
        raise KeyError(secret)

    monkeypatch.setattr(completions, "_completion_prompts", broken)
    answer = client.post("/v1/completions", json=COMPLETION)
    assert answer.status_code == 500
    assert error_message(answer) == guards.internal_error_text(KeyError())
    monkeypatch.setattr(local_backend(), "capabilities", broken)
    tinker_answer = client.get("/api/v1/get_server_capabilities")
    assert tinker_answer.status_code == 500 and "KeyError" in error_message(tinker_answer)
    for response in (answer, tinker_answer):
        assert_public(response)


def test_public_text_replaces_store_home_and_tilde_paths() -> None:
    store = local_backend().store.root
    text = guards.public_text(f"no run in '{store}/runs'; cache {Path.home()}/.cache/hf/x, see ~/.cache/huggingface")
    assert text == "no run in '<store>/runs'; cache <path>, see <path>"


# -- loose edges ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/api/v1/create_session"])
def test_bodies_that_are_not_json_get_415(client: TestClient, content_type: str | None, route: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    answer = client.post(route, content=json.dumps(CHAT if route.startswith("/v1") else {"tags": []}),
                         headers=headers)
    assert answer.status_code == 415, answer.text
    assert "application/json" in error_message(answer)


def test_json_with_parameters_and_bodiless_posts_pass(client: TestClient) -> None:
    assert client.post("/api/v1/create_session", content=b'{"tags": []}',
                       headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 200
    session = new_session(client)
    assert client.post(f"/api/v1/sessions/{session}/finish").status_code == 200  # no body, no Content-Type


@pytest.mark.parametrize(("origin", "status"), [
    ("https://evil.example", 403), ("null", 403), ("http://localhost:3000", 200), ("http://127.0.0.1:8888", 200),
    ("http://[::1]:5173", 200),
])
def test_cross_site_origins_are_refused(client: TestClient, origin: str, status: int) -> None:
    answer = client.get("/v1/models", headers={"Origin": origin})
    assert answer.status_code == status, answer.text
    if status == 403:
        assert "--allow-origin" in error_message(answer)


@pytest.mark.parametrize(("host", "status"), [
    ("evil.example", 400), ("evil.example:8000", 400), ("localhost:8000", 200), ("127.0.0.1", 200),
    ("[::1]:8000", 200),
])
def test_a_loopback_server_answers_only_loopback_host_names(client: TestClient, host: str, status: int) -> None:
    answer = client.get("/v1/models", headers={"Host": host})
    assert answer.status_code == status, answer.text
    if status == 400:
        assert "--allow-host" in error_message(answer)


def test_allowed_hosts_and_origins_widen_the_checks() -> None:
    app = create_app(local_backend(), allowed_hosts=["models.internal"], allowed_origins=["https://ui.example"])
    client = TestClient(app, base_url="http://models.internal")
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"Origin": "https://ui.example"}).status_code == 200
    assert client.get("/v1/models", headers={"Origin": "http://models.internal"}).status_code == 200  # own origin
    assert client.get("/v1/models", headers={"Origin": "https://other.example"}).status_code == 403
    assert client.get("/v1/models", headers={"Host": "other.internal"}).status_code == 400
    # A public bind is guarded by its key; any name reaches it.
    public = TestClient(create_app(local_backend(), host="0.0.0.0", api_key="tml-0123456789abcdef"),
                        base_url="http://203.0.113.7")
    assert public.get("/v1/models", headers={"X-API-Key": "tml-0123456789abcdef"}).status_code == 200


def test_finishing_an_unknown_session_is_a_404_and_finishing_twice_is_fine(client: TestClient) -> None:
    answer = client.post("/api/v1/sessions/no-such-session/finish")
    assert answer.status_code == 404 and "no-such-session" in error_message(answer)
    session = new_session(client)
    for _ in range(2):
        assert client.post(f"/api/v1/sessions/{session}/finish", json={"reason": {"type": "success"}}).status_code \
            == 200
    assert client.post("/api/v1/session_heartbeat", json={"session_id": session}).status_code == 410


def test_the_official_sdk_works_through_all_checks(server: Any) -> None:
    """The SDK's requests (JSON, protobuf, bodiless posts) pass the header checks of the full app."""
    service = tinker.ServiceClient(base_url=server.url)
    training = service.create_lora_training_client(MODEL, rank=2)
    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([1, 5, 9]),
                               loss_fn_inputs={"target_tokens": [5, 9, 14], "weights": [1.0, 1.0, 1.0]})
    assert training.forward_backward([datum], "cross_entropy").result().loss_fn_outputs
    training.optim_step(tinker.types.AdamParams(learning_rate=1e-3)).result()
    sampler = training.save_weights_and_get_sampling_client("hostile")
    response = sampler.sample(tinker.types.ModelInput.from_ints([1, 2]), 1,
                              tinker.types.SamplingParams(max_tokens=2, top_k=2**40)).result()
    assert len(response.sequences[0].tokens) == 2
    start = time.monotonic()
    assert service.create_rest_client().list_training_runs().result().training_runs
    assert time.monotonic() - start < 60


def test_allowed_pages_get_cors_headers_and_their_preflight_is_answered(client: TestClient) -> None:
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    answer = client.get("/v1/models", headers={"Origin": "http://127.0.0.1:8080"})
    assert answer.headers["access-control-allow-origin"] == "http://127.0.0.1:8080"
    refused = client.options("/v1/chat/completions", headers={"Origin": "https://evil.example",
                                                              "Access-Control-Request-Method": "POST"})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers


def test_serve_passes_allowed_hosts_and_origins_to_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    import tinker_cookbook.server as server_package
    from tinker_cookbook import cli, perf_env

    seen: dict[str, Any] = {}
    monkeypatch.setattr(server_package, "serve", lambda backend, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(perf_env, "reexec_with_fast_malloc", lambda: None)
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    assert cli.main(["serve", "--port", "0", "--allow-host", "models.internal", "--allow-host", "gpu-box",
                     "--allow-origin", "https://ui.example"]) == 0
    assert seen["allowed_hosts"] == ["models.internal", "gpu-box"]
    assert seen["allowed_origins"] == ["https://ui.example"]


def test_a_checkpoint_that_does_not_load_leaves_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from tinker_cookbook.engine.training import session as engine_session

    service = tinker.ServiceClient()
    path = service.create_lora_training_client(MODEL, rank=2).save_state("loadable").result().path
    rest = service.create_rest_client()
    before = rest.list_training_runs(limit=1000).result().training_runs

    def unreadable(*args: Any, **kwargs: Any) -> None:
        raise OSError("the adapter file is truncated")

    monkeypatch.setattr(engine_session.TrainingSession, "load_state", unreadable)
    with pytest.raises(tinker.APIError, match="truncated"):
        service.create_training_client_from_state(path)
    assert rest.list_training_runs(limit=1000).result().training_runs == before
