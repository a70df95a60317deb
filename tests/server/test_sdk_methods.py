"""Every public method of the official SDK 0.38's four clients, over HTTP against this server.

``SERVED`` lists the methods this server implements, each driven below (sync and async forms); ``CLIENT_SIDE``
those the SDK answers without the server; ``HOSTED_ONLY`` those that need the hosted service's account features,
which this server refuses at once with a 4xx naming the missing route or reason (the SDK then raises, never hangs).
``test_every_sdk_method_is_accounted_for`` fails when an SDK release adds a method that is in none of them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import pytest
import tinker
from tinker import types as sdk_types

from tinker_cookbook.base.tokenizers import get_tokenizer

MODEL = "tinker-cookbook/tiny-smollm2"
CLIENTS = {"ServiceClient": tinker.ServiceClient, "TrainingClient": tinker.TrainingClient,
           "SamplingClient": tinker.SamplingClient, "RestClient": tinker.RestClient}

SERVED = {
    "ServiceClient": ["close", "create_custom_loss", "create_lora_training_client", "create_rest_client", "create_sampling_client",
                      "create_training_client_from_state", "create_training_client_from_state_with_optimizer",
                      "get_server_capabilities"],
    "TrainingClient": ["create_sampling_client", "forward", "forward_backward", "forward_backward_custom",
                       "get_info", "get_tokenizer", "load_state", "load_state_with_optimizer", "optim_step",
                       "save_state", "save_weights_and_get_sampling_client", "save_weights_for_sampler"],
    "SamplingClient": ["compute_logprobs", "create", "from_sampler_handle", "get_base_model", "get_sampler_handle",
                       "get_tokenizer", "sample"],
    "RestClient": ["delete_checkpoint", "delete_checkpoint_from_tinker_path", "get_sampler", "get_server_capabilities",
                   "get_session", "get_training_run", "get_training_run_by_tinker_path",
                   "get_weights_info_by_tinker_path", "list_checkpoints", "list_sessions", "list_training_runs",
                   "list_user_checkpoints", "publish_checkpoint_from_tinker_path", "set_checkpoint_ttl_from_tinker_path",
                   "unpublish_checkpoint_from_tinker_path"],
}
CLIENT_SIDE = {
    "ServiceClient": ["get_console_url", "get_telemetry"],
    "TrainingClient": ["get_console_url", "get_telemetry"],
    "SamplingClient": ["get_telemetry", "on_queue_state_change"],
    "RestClient": ["get_telemetry"],
}
# method -> (why this server cannot serve it, a call that tries anyway)
HOSTED_ONLY: dict[str, tuple[str, Callable[[Any, Any, Any], Any]]] = {
    "ServiceClient.copy_weights": ("copies between accounts' projects", lambda s, r, t: s.copy_weights("tinker://x/weights/a")),
    "TrainingClient.save_weights_external": ("encrypted export to external storage",
                                             lambda s, r, t: t.save_weights_external("x")),
    "RestClient.copy_weights": ("copies between accounts' projects", lambda s, r, t: r.copy_weights("tinker://x/weights/a", "project")),
    "RestClient.assign_session_project": ("account projects", lambda s, r, t: r.assign_session_project("s", "p")),
    "RestClient.export_session_trace": ("the hosted service's traces", lambda s, r, t: r.export_session_trace("s")),
    "RestClient.get_audit_log": ("account audit logs", lambda s, r, t: r.get_audit_log()),
    "RestClient.get_billing_usage": ("billing", lambda s, r, t: r.get_billing_usage("2026-01-01", "2026-01-02")),
    "RestClient.get_current_checkpoint_storage_usage": ("billing", lambda s, r, t: r.get_current_checkpoint_storage_usage()),
    "RestClient.get_external_weights_urls": ("signed URLs of external storage",
                                             lambda s, r, t: r.get_external_weights_urls("tinker://x/external_weights/a")),
    "RestClient.search_sessions": ("account-wide session search",
                                   lambda s, r, t: r.search_sessions(sdk_types.SessionSearchRequest())),
    "RestClient.whoami": ("JWT accounts (the SDK refuses it itself with a plain API key)", lambda s, r, t: r.whoami()),
}


def _public(cls: type) -> set[str]:
    """The public methods, an ``_async`` twin folded into its sync name."""
    return {n.removesuffix("_async") for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)}


def test_every_sdk_method_is_accounted_for() -> None:
    for name, cls in CLIENTS.items():
        hosted = {m.split(".")[1] for m in HOSTED_ONLY if m.startswith(name + ".")}
        listed = set(SERVED[name]) | set(CLIENT_SIDE[name]) | hosted
        assert _public(cls) == listed, (name, sorted(_public(cls) ^ listed))


@pytest.fixture
def service(server_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TINKER_BASE_URL", server_url)  # from_sampler_handle reads the server from the environment
    with tinker.ServiceClient(base_url=server_url) as service_client:
        yield service_client


def _datum(tokenizer: Any, text: str) -> sdk_types.Datum:
    tokens = tokenizer.encode(text)
    return sdk_types.Datum(model_input=sdk_types.ModelInput.from_ints(tokens[:-1]),
                           loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


@pytest.fixture
def hub_tokenizer(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SDK's ``get_tokenizer`` loads ``model_data.tokenizer_id`` from the model hub, which the tests cannot
    reach: serve it this project's offline copy and record the names asked for."""
    import transformers

    asked: list[str] = []
    offline = get_tokenizer(MODEL)  # loaded before the patch, which it would otherwise go through

    def from_pretrained(name: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(name)
        return offline

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    return asked


def test_served_methods_sync(service, server_url: str, hub_tokenizer: list[str]) -> None:
    tokenizer = get_tokenizer(MODEL)
    data = [_datum(tokenizer, "English: hello\nPig Latin: ello-hay")]
    adam = sdk_types.AdamParams(learning_rate=1e-3)
    with pytest.warns(FutureWarning):  # deprecated in 0.38 in favour of RestClient's, which is driven below
        assert MODEL in [m.model_name for m in service.get_server_capabilities().supported_models]
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=21).result()
    info = tc.get_info()
    assert info.model_data.model_name == MODEL and tc.get_tokenizer() is not None
    assert hub_tokenizer == [info.model_data.tokenizer_id]  # the real model's tokenizer, by its hub name
    assert tc.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].shape == [len(data[0].loss_fn_inputs["target_tokens"].data)]
    tc.forward_backward(data, "cross_entropy").result()
    tc.forward_backward_custom(data, lambda d, lps: (-sum(lp.sum() for lp in lps), {})).result()
    # A loss handle: the per-datum form of a custom loss (this server's flags have the SDK run it client-side).
    handle = service.create_custom_loss(lambda logprobs, weights: (-(logprobs * weights).sum(), {}),
                                        {"logprobs": 1, "weights": 1}).result()
    by_handle = tc.forward_backward_custom(data, handle).result()
    assert by_handle.metrics
    assert tc.optim_step(adam).result().metrics["grad_norm"] > 0
    state = tc.save_state("walk").result().path
    sampler_path = tc.save_weights_for_sampler("walk-sampler").result().path
    tc.load_state(state).result()
    tc.load_state_with_optimizer(state).result()
    for sampler in (tc.save_weights_and_get_sampling_client().result(), tc.create_sampling_client(sampler_path).result(),
                    service.create_sampling_client(base_model=MODEL).result()):
        prompt = sdk_types.ModelInput.from_ints(tokenizer.encode("English: cat\nPig Latin:"))
        out = sampler.sample(prompt, 2, sdk_types.SamplingParams(max_tokens=2, temperature=0.0)).result()
        assert len(out.sequences) == 2 and all(s.sequence_id for s in out.sequences)
        assert sampler.compute_logprobs(prompt).result()[0] is None
        assert sampler.get_base_model() == MODEL and sampler.get_tokenizer() is not None
    handle = sampler.get_sampler_handle()
    rebuilt = tinker.SamplingClient.from_sampler_handle(handle)
    assert rebuilt.get_base_model() == MODEL
    assert service.create_training_client_from_state(state).result().get_info().model_data.model_name == MODEL
    assert service.create_training_client_from_state_with_optimizer(state).result() is not None

    rest = service.create_rest_client()
    run_id = tc.model_id
    assert rest.get_server_capabilities().result().supported_models
    assert rest.get_training_run(run_id).result().base_model == MODEL
    assert rest.get_training_run_by_tinker_path(state).result().training_run_id == run_id
    assert rest.get_weights_info_by_tinker_path(state).result().lora_rank == 4
    assert run_id in [r.training_run_id for r in rest.list_training_runs(limit=1000).result().training_runs]
    assert {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints} == {state, sampler_path}
    assert state in [c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints]
    rest.publish_checkpoint_from_tinker_path(sampler_path).result()
    rest.unpublish_checkpoint_from_tinker_path(sampler_path).result()
    rest.set_checkpoint_ttl_from_tinker_path(state, 3600).result()
    rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    rest.delete_checkpoint(run_id, "weights/walk").result()
    assert rest.list_checkpoints(run_id).result().checkpoints == []
    session_id = service.holder.get_session_id()
    assert session_id in rest.list_sessions(limit=1000).result().sessions
    session = rest.get_session(session_id).result()
    assert run_id in session.training_run_ids and len(session.sampler_ids) >= 3
    assert {rest.get_sampler(i).result().base_model for i in session.sampler_ids} == {MODEL}


def test_served_methods_async(service) -> None:
    tokenizer = get_tokenizer(MODEL)
    data = [_datum(tokenizer, "English: dog\nPig Latin: og-day")]

    async def walk() -> None:
        assert (await service.get_server_capabilities_async()).supported_models
        tc = await service.create_lora_training_client_async(base_model=MODEL, rank=4, seed=22)
        assert (await tc.get_info_async()).model_data.model_name == MODEL
        await (await tc.forward_async(data, "cross_entropy"))
        await (await tc.forward_backward_async(data, "cross_entropy"))
        await (await tc.forward_backward_custom_async(data, lambda d, lps: (-sum(lp.sum() for lp in lps), {})))
        await (await tc.optim_step_async(sdk_types.AdamParams(learning_rate=1e-3)))
        state = (await (await tc.save_state_async("walk-async"))).path
        sampler_path = (await (await tc.save_weights_for_sampler_async("walk-async-s"))).path
        await (await tc.load_state_async(state))
        await (await tc.load_state_with_optimizer_async(state))
        sampler = await tc.save_weights_and_get_sampling_client_async()
        prompt = sdk_types.ModelInput.from_ints(tokenizer.encode("English: sun\nPig Latin:"))
        out = await sampler.sample_async(prompt, 1, sdk_types.SamplingParams(max_tokens=2))
        assert out.sequences[0].sequence_id
        assert (await sampler.compute_logprobs_async(prompt))[0] is None
        assert await sampler.get_base_model_async() == MODEL
        assert (await tc.create_sampling_client_async(sampler_path)) is not None
        assert (await service.create_sampling_client_async(base_model=MODEL)) is not None
        assert (await service.create_training_client_from_state_async(state)) is not None
        assert (await service.create_training_client_from_state_with_optimizer_async(state)) is not None
        rest = service.create_rest_client()
        run_id = tc.model_id
        assert (await rest.get_training_run_async(run_id)).base_model == MODEL
        assert (await rest.get_training_run_by_tinker_path_async(state)).training_run_id == run_id
        assert (await rest.list_training_runs_async(limit=1000)).training_runs
        assert len((await rest.list_checkpoints_async(run_id)).checkpoints) == 2
        assert (await rest.list_user_checkpoints_async(limit=1000)).checkpoints
        await rest.publish_checkpoint_from_tinker_path_async(sampler_path)
        await rest.unpublish_checkpoint_from_tinker_path_async(sampler_path)
        await rest.set_checkpoint_ttl_from_tinker_path_async(state, 3600)
        await rest.delete_checkpoint_from_tinker_path_async(sampler_path)
        await rest.delete_checkpoint_async(run_id, "weights/walk-async")
        session_id = service.holder.get_session_id()
        assert session_id in (await rest.list_sessions_async(limit=1000)).sessions
        session = await rest.get_session_async(session_id)
        assert run_id in session.training_run_ids
        assert (await rest.get_sampler_async(session.sampler_ids[-1])).base_model == MODEL

    asyncio.run(walk())


def test_client_side_methods(service) -> None:
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=23).result()
    sampler = service.create_sampling_client(base_model=MODEL).result()
    for client in (service, tc, sampler, service.create_rest_client()):
        client.get_telemetry()  # None: telemetry is off in tests (TINKER_TELEMETRY=0)
    assert isinstance(service.get_console_url(), str) and isinstance(tc.get_console_url(), str)
    sampler.on_queue_state_change(*_a_queue_state())


def _a_queue_state() -> tuple[Any, None]:
    from tinker.lib.public_interfaces.sampling_client import QueueState  # the callback's argument type

    return next(iter(QueueState)), None


@pytest.mark.parametrize("method", sorted(HOSTED_ONLY))
def test_hosted_only_methods_fail_fast_and_clearly(method: str, service, monkeypatch: pytest.MonkeyPatch) -> None:
    why, call = HOSTED_ONLY[method]
    monkeypatch.setenv("TINKER_PROJECT_ID", "project")  # copy_weights names a destination project
    tc = (service.create_lora_training_client(base_model=MODEL, rank=4, seed=24).result()
          if method.startswith("Training") else None)
    start = time.monotonic()
    with pytest.raises((tinker.TinkerError, RuntimeError)) as raised:
        result = call(service, service.create_rest_client(), tc)
        if hasattr(result, "result"):
            result.result()
    # The SDK retries only 408/409/429/5xx and connection errors: a 4xx ends it at once.
    assert time.monotonic() - start < 30, (method, why)
    assert isinstance(raised.value, RuntimeError) or getattr(raised.value, "status_code", 404) < 500, raised.value


# Field differences between the SDK's types and this project's that are intended, and why.
FIELD_DIFFERENCES = {
    # The SDK's numpy-backed storage (``*_np``) versus plain lists here; both expose the list properties.
    "SampledSequence": ({"logprobs_np", "tokens_np", "topk_logprobs_np"}, {"logprobs", "tokens"}),
    "SampleResponse": ({"prompt_logprobs_np", "topk_prompt_logprobs_np", "prompt_alt_tokens",
                        "target_prompt_logprobs"}, {"prompt_logprobs", "topk_prompt_logprobs", "type"}),
    # Sparse CSR loss inputs are densified on arrival (the server reads both layouts).
    "TensorData": ({"sparse_col_indices", "sparse_crow_indices"}, {"data"}),
    # A discriminator, so that the two span kinds (identical fields) survive JSON.
    "PromptProvenanceSpan": (set(), {"type"}),
    "SampledProvenanceSpan": (set(), {"type"}),
    # The losses this engine has (the SDK's type drops it; the wire answer carries it).
    "GetServerCapabilitiesResponse": (set(), {"supported_loss_fns"}),
}


def _fields(cls: type) -> set[str]:
    import dataclasses

    if hasattr(cls, "model_fields"):
        return set(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    return set()  # an alias or a plain class: no fields to compare


def test_types_have_the_sdk_fields() -> None:
    """Every type both define has the SDK 0.38's fields, but for the differences listed (and explained) above."""
    from tinker_cookbook.tinker import types as ours

    shared = [n for n in dir(ours) if isinstance(getattr(ours, n), type) and isinstance(getattr(sdk_types, n, None), type)]
    assert len(shared) > 30
    for name in shared:
        theirs_only = _fields(getattr(sdk_types, name)) - _fields(getattr(ours, name))
        ours_only = _fields(getattr(ours, name)) - _fields(getattr(sdk_types, name))
        assert (theirs_only, ours_only) == FIELD_DIFFERENCES.get(name, (set(), set())), name
