"""The Tinker protocol below the SDK: malformed requests, the futures protocol, and the protobuf codec checked
against the SDK's own (generated) protobuf code."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
from server_utils import serve
from tinker.proto import request_conv, response_conv
from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

from tinker_cookbook.server import tinker_api, tinker_proto, tinker_sessions
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"


def post(url: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/{path}", timeout=60, **kwargs)


def wait_result(url: str, request_id: str) -> Any:
    for _ in range(100):
        body = post(url, "retrieve_future", json={"request_id": request_id}).json()
        if body.get("type") != "try_again":
            return body
    raise AssertionError("the future never finished")


def new_model(url: str) -> str:
    session_id = post(url, "create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    answer = post(url, "create_model", json={"session_id": session_id, "model_seq_id": 0, "base_model": MODEL,
                                             "lora_config": {"rank": 4}})
    return wait_result(url, answer.json()["request_id"])["model_id"]


# -- malformed requests: 4xx with a body that says what is wrong, never a crash ----------------------------------

def test_bad_json_is_a_400_that_says_so(server_url: str) -> None:
    answer = post(server_url, "create_session", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert "not valid JSON" in answer.json()["detail"]


def test_unknown_fields_are_named(server_url: str) -> None:
    answer = post(server_url, "create_session", json={"tags": [], "sdk_version": "x", "colour": "blue"})
    assert answer.status_code == 400
    assert "unknown field 'colour'" in answer.json()["detail"]


def test_malformed_protobuf_is_a_400(server_url: str) -> None:
    answer = post(server_url, "forward_backward", content=b"\x0a\xff\xff", headers={"content-type": tinker_api.PROTOBUF})
    assert answer.status_code == 400
    assert "protobuf body is malformed" in answer.json()["detail"]


def test_unknown_ids_are_404(server_url: str) -> None:
    assert post(server_url, "retrieve_future", json={"request_id": "req-nope"}).status_code == 404
    answer = post(server_url, "optim_step", json={"model_id": "run-nope", "adam_params": {"learning_rate": 0.1}})
    assert answer.status_code == 404 and "run-nope" in answer.json()["detail"]


def test_num_samples_is_limited(server_url: str) -> None:
    body = {"base_model": MODEL, "num_samples": tinker_api.MAX_NUM_SAMPLES + 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}, "sampling_params": {"max_tokens": 1}}
    answer = post(server_url, "asample", json=body)
    assert answer.status_code == 400 and "num_samples" in answer.json()["detail"]


def test_a_failed_request_is_reported_through_its_future(server_url: str) -> None:
    model_id = new_model(server_url)
    answer = post(server_url, "optim_step", json={"model_id": model_id, "adam_params": {"learning_rate": -1.0}})
    result = wait_result(server_url, answer.json()["request_id"])
    assert result["category"] == "user" and result["error"].startswith("BadRequestError: ")


# -- futures survive slow operations ------------------------------------------------------------------------------

class GatedBackend:
    """The real engine, except that ``save`` waits for ``gate`` (a stand-in for a slow request)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save(self, run_id: str, *args: Any) -> concurrent.futures.Future[Any]:
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            self.gate.wait()
            try:
                out.set_result(self.inner.save(run_id, *args).result())
            except Exception as exc:  # noqa: BLE001
                out.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return out


def test_a_slow_request_answers_try_again_until_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastapi

    from tinker_cookbook.backends import local_backend

    monkeypatch.setattr(tinker_api, "RETRIEVE_WAIT_S", 0.05)
    backend = GatedBackend(local_backend())
    app = fastapi.FastAPI()
    app.include_router(tinker_api.build_router(backend))  # type: ignore[arg-type]
    for url in serve(app):
        model_id = new_model(url)
        request_id = post(url, "save_weights", json={"model_id": model_id, "path": "slow"}).json()["request_id"]
        for _ in range(3):  # the request is held: every poll is answered, with try_again
            assert post(url, "retrieve_future", json={"request_id": request_id}).json()["type"] == "try_again"
        backend.gate.set()
        assert wait_result(url, request_id)["path"] == f"tinker://{model_id}/weights/slow"


# -- the protobuf codec, checked against the SDK's generated code ----------------------------------------------

def test_forward_backward_request_decodes_what_the_sdk_encodes() -> None:
    sparse = tinker.TensorData(data=[0.5, -2.0], dtype="float32", shape=[2, 3],
                               sparse_crow_indices=[0, 1, 2], sparse_col_indices=[2, 0])
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": tinker.TensorData(data=[6, 7, 8], dtype="int64", shape=[3]),
                        "weights": tinker.TensorData(data=[0.0, 1.0, 0.25], dtype="float32", shape=[3]),
                        "mask": sparse},
    )
    request = ForwardBackwardRequest(forward_backward_input=ForwardBackwardInput(
        data=[datum], loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7}), model_id="run-x", seq_id=4)
    message = request_conv.forward_backward_request_to_proto(request)
    message.forward_only = True
    decoded = tinker_proto.decode_forward_backward_request(message.SerializeToString())
    assert decoded["model_id"] == "run-x" and decoded["seq_id"] == 4 and decoded["forward_only"] is True
    assert decoded["loss_fn"] == "ppo" and decoded["loss_fn_config"] == {"clip_low_threshold": 0.7}
    [got] = decoded["data"]
    assert got.model_input.to_ints() == [5, 6, 7]
    assert got.loss_fn_inputs["target_tokens"].data == [6, 7, 8]
    assert got.loss_fn_inputs["weights"].data == [0.0, 1.0, 0.25]
    assert got.loss_fn_inputs["mask"].shape == [2, 3]
    assert got.loss_fn_inputs["mask"].data == [0.0, 0.0, 0.5, -2.0, 0.0, 0.0]


def test_forward_backward_output_encodes_what_the_sdk_decodes() -> None:
    output = types.ForwardBackwardOutput(
        loss_fn_output_type="cross_entropy",
        loss_fn_outputs=[{"logprobs": types.TensorData(data=[-0.5, -1.25, -3.0], dtype="float32", shape=[3])},
                         {"logprobs": types.TensorData(data=[-0.125] * 8, dtype="float32", shape=[4, 2])}],
        metrics={"loss:sum": 12.5},
    )
    decoded = response_conv.deserialize_forward_backward_output(tinker_proto.encode_forward_backward_output(output))
    assert decoded.metrics == {"loss:sum": 12.5}
    assert [out["logprobs"].shape for out in decoded.loss_fn_outputs] == [[3], [4, 2]]
    assert decoded.loss_fn_outputs[0]["logprobs"].tolist() == [-0.5, -1.25, -3.0]
    assert np.array_equal(decoded.loss_fn_outputs[1]["logprobs"].to_numpy(), np.full((4, 2), -0.125))


def test_sample_response_encodes_what_the_sdk_decodes() -> None:
    response = types.SampleResponse(
        sequences=[types.SampledSequence(stop_reason="stop", tokens=[3, 4], logprobs=[-0.5, -0.25]),
                   types.SampledSequence(stop_reason="length", tokens=[9], logprobs=None)],
        prompt_logprobs=[None, -1.5, -2.0],
        topk_prompt_logprobs=[None, [(7, -0.5), (8, -1.0)], [(2, -0.75)]],
    )
    decoded = response_conv.deserialize_sample_response(tinker_proto.encode_sample_response(response))
    assert [(s.stop_reason, s.tokens, s.logprobs) for s in decoded.sequences] == [
        ("stop", [3, 4], [-0.5, -0.25]), ("length", [9], None)]
    assert decoded.prompt_logprobs == [None, -1.5, -2.0]
    assert decoded.topk_prompt_logprobs == [None, [(7, -0.5), (8, -1.0)], [(2, -0.75)]]


def test_a_session_without_heartbeats_is_closed_and_frees_its_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastapi

    from tinker_cookbook.backends import local_backend

    backend = local_backend()
    app = fastapi.FastAPI()
    app.include_router(tinker_api.build_router(backend))
    for url in serve(app):
        session_id = post(url, "create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
        answer = post(url, "create_model", json={"session_id": session_id, "model_seq_id": 0, "base_model": MODEL,
                                                 "lora_config": {"rank": 4}})
        model_id = wait_result(url, answer.json()["request_id"])["model_id"]
        assert post(url, "session_heartbeat", json={"session_id": session_id}).status_code == 200

        monkeypatch.setattr(tinker_sessions, "SESSION_TIMEOUT_S", -1.0)  # every session is now overdue
        post(url, "create_session", json={"tags": [], "sdk_version": "test"})  # any new session sweeps
        backend.submit(lambda: None).result()  # the engine thread is FIFO: the queued release has run
        assert model_id not in backend._sessions  # white-box: the adapter and its Adam state are gone
        assert post(url, "session_heartbeat", json={"session_id": session_id}).status_code == 410
        answer = post(url, "optim_step", json={"model_id": model_id, "adam_params": {"learning_rate": 0.1}})
        assert answer.status_code == 404


def test_a_session_keeps_a_bounded_number_of_sampling_sessions(server_url: str) -> None:
    session_id = post(server_url, "create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    samplers = [post(server_url, "create_sampling_session",
                     json={"session_id": session_id, "sampling_session_seq_id": i, "base_model": MODEL}
                     ).json()["sampling_session_id"] for i in range(tinker_sessions.MAX_SAMPLERS_PER_SESSION + 1)]
    sample = {"num_samples": 1, "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
              "sampling_params": {"max_tokens": 1}}
    # The oldest one was dropped to keep the bound; the newest still samples.
    assert post(server_url, "asample", json={**sample, "sampling_session_id": samplers[0]}).status_code == 404
    answer = post(server_url, "asample", json={**sample, "sampling_session_id": samplers[-1]})
    assert answer.status_code == 200 and len(answer.json()["sample_sequence_ids"]) == 1
    post(server_url, f"sessions/{session_id}/finish", json={})
    assert post(server_url, "asample", json={**sample, "sampling_session_id": samplers[-1]}).status_code == 404
