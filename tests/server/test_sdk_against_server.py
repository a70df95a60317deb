"""The official ``tinker`` SDK, unchanged, against this project's Tinker-protocol server on the tiny models.

The server runs the in-process engine of the test process, so every result can be checked against the same engine
used directly through ``tinker_cookbook.tinker`` with the same seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.request

import pytest
import tinker  # the official SDK (tests/server/conftest.py skips this package without it)
from tinker import types as sdk_types

from tinker_cookbook import tinker as local_tinker
from tinker_cookbook.base.tokenizers import get_tokenizer
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"
# Logprobs cross the wire as float32 (the protocol's tensor dtype), the engine computes them in float32 too: the
# same engine with the same seed gives bitwise-equal values, so only float32 rounding of the comparison remains.
FLOAT32_RTOL = 1e-6

EXAMPLES = [("banana split", "anana-bay plit-say"), ("quantum physics", "uantum-qay ysics-phay"),
            ("donut shop", "onut-day op-shay")]


def process_example(example: tuple[str, str], tokenizer) -> sdk_types.Datum:
    """The docs' quickstart datum: prompt weights 0, completion weights 1, targets shifted by one."""
    prompt_tokens = tokenizer.encode(f"English: {example[0]}\nPig Latin:", add_special_tokens=True)
    completion_tokens = tokenizer.encode(f" {example[1]}\n\n", add_special_tokens=False)
    tokens = prompt_tokens + completion_tokens
    weights = [0] * len(prompt_tokens) + [1] * len(completion_tokens)
    return sdk_types.Datum(model_input=sdk_types.ModelInput.from_ints(tokens=tokens[:-1]),
                           loss_fn_inputs=dict(weights=weights[1:], target_tokens=tokens[1:]))


def as_local(datum: sdk_types.Datum) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(datum.model_input.to_ints()),
                       loss_fn_inputs={k: types.TensorData(data=v.tolist(), dtype=v.dtype)
                                       for k, v in datum.loss_fn_inputs.items()})


@pytest.fixture
def service(server_url: str):
    with tinker.ServiceClient(base_url=server_url) as service_client:
        yield service_client


@pytest.fixture(scope="module")
def tokenizer():
    # The SDK's own get_tokenizer() downloads from the model hub; these tests run offline with the local copy.
    return get_tokenizer(MODEL)


def test_docs_quickstart_trains_saves_and_samples(service, server_url: str, tokenizer) -> None:
    """The training-and-sampling guide, step by step: capabilities, a LoRA client, six updates on one batch (the
    loss falls), a named sampler snapshot, greedy samples, prompt logprobs."""
    names = [m.model_name for m in tinker.RestClient(base_url=server_url).get_server_capabilities()
             .result().supported_models]
    assert MODEL in names
    training_client = service.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    data = [process_example(ex, tokenizer) for ex in EXAMPLES]
    losses = []
    for _ in range(6):
        fwdbwd_future = training_client.forward_backward(data, "cross_entropy")
        optim_future = training_client.optim_step(sdk_types.AdamParams(learning_rate=1e-2))
        result = fwdbwd_future.result()
        optim_future.result()
        logprobs = [lp for out in result.loss_fn_outputs for lp in out["logprobs"].tolist()]
        weights = [w for d in data for w in d.loss_fn_inputs["weights"].tolist()]
        losses.append(-sum(lp * w for lp, w in zip(logprobs, weights)) / sum(weights))
    assert losses[-1] < losses[0] - 0.5, losses  # lr 1e-2 on one repeated batch: the tiny model memorises it

    sampling_client = training_client.save_weights_and_get_sampling_client(name="pig-latin-model").result()
    prompt = sdk_types.ModelInput.from_ints(tokenizer.encode("English: coffee break\nPig Latin:"))
    params = sdk_types.SamplingParams(max_tokens=6, temperature=0.0)
    sequences = sampling_client.sample(prompt=prompt, sampling_params=params, num_samples=3).result().sequences
    assert len(sequences) == 3 and all(len(s.tokens) == 6 and s.stop_reason == "length" for s in sequences)
    assert sequences[0].tokens == sequences[1].tokens == sequences[2].tokens  # greedy
    assert all(s.sequence_id for s in sequences)  # the protocol's per-sample ids reached the SDK

    prompt_logprobs = sampling_client.compute_logprobs(prompt).result()
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == prompt.length
    assert all(lp is not None and lp < 0 for lp in prompt_logprobs[1:])


def test_forward_matches_the_in_process_engine(service, tokenizer) -> None:
    """The same seed on both paths gives the same adapter, so the logprobs through HTTP equal the direct ones."""
    datum = process_example(EXAMPLES[0], tokenizer)
    remote = service.create_lora_training_client(base_model=MODEL, rank=4, seed=7).result()
    remote_lp = remote.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    local = local_tinker.ServiceClient().create_lora_training_client(MODEL, rank=4, seed=7)
    local_lp = local.forward([as_local(datum)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    local.close()
    assert remote_lp == pytest.approx(local_lp, rel=FLOAT32_RTOL)


def test_forward_backward_custom_equals_the_built_in_loss(service, tokenizer) -> None:
    """A custom loss written as cross-entropy gives the same gradient as cross_entropy itself.

    The SDK computes custom losses client-side: a forward pass, the loss and its gradient on the client, then a
    forward_backward whose weights carry the gradient. The weights cross the wire as float32, so the gradient
    norms agree to float32 precision (1e-5 relative leaves room for the sum over the adapter's parameters).
    """
    data = [process_example(ex, tokenizer) for ex in EXAMPLES[:2]]

    def cross_entropy(batch, logprobs):
        loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(batch, logprobs))
        return loss, {"custom_loss": float(loss.detach())}

    custom = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    custom_out = custom.forward_backward_custom(data, cross_entropy).result()
    custom_norm = custom.optim_step(sdk_types.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm"]

    builtin = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    builtin_out = builtin.forward_backward(data, "cross_entropy").result()
    builtin_norm = builtin.optim_step(sdk_types.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm"]

    assert custom_out.metrics["custom_loss"] == pytest.approx(builtin_out.metrics["loss:sum"], rel=1e-5)
    assert custom_norm == pytest.approx(builtin_norm, rel=1e-5)


def test_save_load_and_resume_continue_exactly(service, tokenizer) -> None:
    """save_state, then a new client from that checkpoint with its optimizer, repeats the same next step."""
    data = [process_example(ex, tokenizer) for ex in EXAMPLES]
    adam = sdk_types.AdamParams(learning_rate=1e-2)
    first = service.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
    first.forward_backward(data, "cross_entropy")
    first.optim_step(adam).result()
    path = first.save_state("step-1").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/step-1")
    first.forward_backward(data, "cross_entropy")
    first.optim_step(adam).result()
    expected = first.forward(data[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()

    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.get_info().model_data.model_name == MODEL
    resumed.forward_backward(data, "cross_entropy")
    resumed.optim_step(adam).result()
    got = resumed.forward(data[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert got == pytest.approx(expected, rel=FLOAT32_RTOL)

    # Weights only (a fresh optimizer) differs from the resumed run after the same step: Adam's moments matter.
    weights_only = service.create_training_client_from_state(path).result()
    weights_only.forward_backward(data, "cross_entropy")
    weights_only.optim_step(adam).result()
    other = weights_only.forward(data[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert other != pytest.approx(expected, rel=1e-4)


def test_rest_client_lists_and_manages_checkpoints(service, server_url: str, tokenizer) -> None:
    training_client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=2).result()
    run_id = training_client.model_id
    state_path = training_client.save_state("kept").result().path
    sampler_path = training_client.save_weights_for_sampler("for-sampling").result().path

    rest = tinker.RestClient(base_url=server_url)
    listed = {c.tinker_path: c for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert set(listed) == {state_path, sampler_path}
    assert listed[state_path].checkpoint_type == "training" and listed[state_path].checkpoint_id == "weights/kept"
    assert listed[sampler_path].checkpoint_type == "sampler"
    assert run_id in [r.training_run_id for r in rest.list_training_runs(limit=100).result().training_runs]
    run = rest.get_training_run(run_id).result()
    assert run.base_model == MODEL and run.lora_rank == 4
    assert rest.get_training_run_by_tinker_path(state_path).result().training_run_id == run_id
    info = rest.get_weights_info_by_tinker_path(state_path).result()
    assert info.base_model == MODEL and info.lora_rank == 4
    assert state_path in [c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints]

    rest.publish_checkpoint_from_tinker_path(sampler_path).result()
    assert {c.tinker_path: c.public for c in rest.list_checkpoints(run_id).result().checkpoints}[sampler_path]
    rest.unpublish_checkpoint_from_tinker_path(sampler_path).result()
    assert not {c.tinker_path: c.public for c in rest.list_checkpoints(run_id).result().checkpoints}[sampler_path]
    rest.set_checkpoint_ttl_from_tinker_path(state_path, 7200).result()
    rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    assert [c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints] == [state_path]

    sampler = service.create_sampling_client(model_path=state_path.replace("/weights/", "/sampler_weights/"))
    with pytest.raises(tinker.TinkerError):  # that checkpoint does not exist: a clear SDK error, no hang
        sampler.result()


def test_errors_reach_the_sdk_as_its_exception_classes(service, server_url: str) -> None:
    with pytest.raises(tinker.RequestFailedError) as failed:
        service.create_lora_training_client(base_model="no-such/model").result()
    assert "no-such/model" in str(failed.value)
    with pytest.raises(tinker.NotFoundError):
        tinker.RestClient(base_url=server_url).get_training_run("run-that-does-not-exist").result()


def test_many_clients_share_one_engine(service, server_url: str, tokenizer) -> None:
    """Two SDK sessions against one server: their requests interleave, each client keeps its own order."""
    datum = process_example(EXAMPLES[0], tokenizer)
    with tinker.ServiceClient(base_url=server_url) as other_service:
        a = service.create_lora_training_client(base_model=MODEL, rank=4, seed=5).result()
        b = other_service.create_lora_training_client(base_model=MODEL, rank=4, seed=5).result()
        futures = [(c.forward_backward([datum], "cross_entropy"), c.optim_step(sdk_types.AdamParams(learning_rate=1e-2)))
                   for c in (a, b, a, b)]
        norms = [optim.result().metrics["grad_norm"] for _, optim in futures]
    # Same seed and data: a and b take identical steps, whichever order the server interleaved them in.
    assert norms[0] == pytest.approx(norms[1], rel=1e-6) and norms[2] == pytest.approx(norms[3], rel=1e-6)
    assert not math.isclose(norms[0], norms[2])  # the second step of each client saw its own first update


def _rl_datum_with_provenance(prompt: sdk_types.ModelInput, sequence: sdk_types.SampledSequence,
                              advantage: float) -> sdk_types.Datum:
    """The official cookbook's RL datum: prompt + all but the last sampled token in, targets shifted by one, the
    sampler's logprobs and the advantage on the sampled tokens, and its provenance spans (as its rl_loop builds)."""
    tokens, n_prompt = list(sequence.tokens), prompt.length
    model_input = prompt.append(sdk_types.EncodedTextChunk(tokens=tokens[:-1]))
    ob = n_prompt - 1
    datum = sdk_types.Datum(model_input=model_input, loss_fn_inputs={
        "target_tokens": [0] * ob + tokens, "logprobs": [0.0] * ob + list(sequence.logprobs or []),
        "advantages": [0.0] * ob + [advantage] * len(tokens),
        "sequence_ratio_mask": [0.0] * ob + [1.0] * len(tokens)})
    sid = sequence.sequence_id
    return datum.with_provenance(
        model_input=[sdk_types.PromptProvenanceSpan(sequence_id=sid, length=n_prompt),
                     sdk_types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens) - 1)],
        loss_fn_inputs=[sdk_types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=n_prompt - 1),
                        sdk_types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens))])


def test_provenance_spans_train_and_bad_spans_are_refused(service, tokenizer) -> None:
    """Datums carrying provenance spans of sequences this server sampled train (the official RL loop always sends
    them); spans naming an unknown sequence, leaving their sequence or not tiling the datum are 400s naming the
    field."""
    training_client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=11).result()
    sampler = training_client.save_weights_and_get_sampling_client().result()
    prompt = sdk_types.ModelInput.from_ints(tokenizer.encode("English: apple\nPig Latin:"))
    params = sdk_types.SamplingParams(max_tokens=4, temperature=1.0, seed=0)
    sequences = sampler.sample(prompt=prompt, num_samples=2, sampling_params=params).result().sequences
    data = [_rl_datum_with_provenance(prompt, s, a) for s, a in zip(sequences, (1.0, -1.0), strict=True)]
    for loss_fn in ("importance_sampling", "gspo"):
        out = training_client.forward_backward(data, loss_fn).result()
        assert math.isfinite(out.metrics["loss:sum"])
    training_client.optim_step(sdk_types.AdamParams(learning_rate=1e-3)).result()

    good = data[0]
    sid = sequences[0].sequence_id
    unknown = dataclasses.replace(good, model_input_spans=[
        sdk_types.PromptProvenanceSpan(sequence_id="seq-never-issued", length=prompt.length),
        *good.model_input_spans[1:]])
    with pytest.raises(tinker.BadRequestError, match=r"data\[0\]\.model_input_spans\[0\]\.sequence_id='seq-never"):
        training_client.forward_backward([unknown], "importance_sampling").result()
    outside = dataclasses.replace(good, loss_fn_input_spans=[
        sdk_types.PromptProvenanceSpan(sequence_id=sid, offset=5, length=prompt.length - 1),
        *good.loss_fn_input_spans[1:]])
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn_input_spans\[0\] covers positions .* of the prompt"):
        training_client.forward_backward([outside], "importance_sampling").result()
    untiled = dataclasses.replace(good, model_input_spans=good.model_input_spans[:1])
    with pytest.raises(tinker.BadRequestError, match=r"data\[0\]\.model_input_spans covers \d+ positions"):
        training_client.forward_backward([untiled], "importance_sampling").result()


def test_losses_listed_gspo_trains_and_stable_reinforce_is_refused(service, server_url: str, tokenizer) -> None:
    # The SDK's response type has no field for the losses (it drops unknown ones), so read the wire answer.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(f"{server_url}/api/v1/get_server_capabilities", timeout=30) as answer:
        listed = json.load(answer)["supported_loss_fns"]
    assert listed == sorted(["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"])
    training_client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=12).result()
    datum = process_example(EXAMPLES[0], tokenizer)
    with pytest.raises(tinker.TinkerError, match="stable_reinforce' is not available on this engine"):
        training_client.forward_backward([datum], "stable_reinforce").result()
