"""Code written against the official ``tinker`` SDK ports by changing only its import line.

The SDK's names are listed here (from tinker 0.38.0) rather than read from an installed SDK, so that the suite does
not depend on it: each module path real code imports, each exported exception with its base class and HTTP status,
and the keywords and input forms of the training calls.
"""

from __future__ import annotations

import asyncio
import importlib

import numpy as np
import pytest
import torch

from tinker_cookbook import tinker
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

MODEL = "tinker-cookbook/tiny-smollm2"

# SDK module (relative to the package) -> names it defines that this project provides.
SDK_TYPES_MODULES = {
    "checkpoint": ["Checkpoint", "CheckpointType", "ParsedCheckpointTinkerPath"],
    "checkpoints_list_response": ["CheckpointsListResponse"],
    "create_model_response": ["CreateModelResponse"],
    "cursor": ["Cursor"],
    "datum": ["Datum"],
    "encoded_text_chunk": ["EncodedTextChunk"],
    "forward_backward_input": ["ForwardBackwardInput"],
    "forward_backward_output": ["ForwardBackwardOutput"],
    "get_info_response": ["GetInfoResponse", "ModelData"],
    "get_server_capabilities_response": ["GetServerCapabilitiesResponse", "SupportedModel"],
    "image_asset_pointer_chunk": ["ImageAssetPointerChunk"],
    "image_chunk": ["ImageChunk"],
    "load_weights_response": ["LoadWeightsResponse"],
    "lora_config": ["LoraConfig"],
    "loss_fn_inputs": ["LossFnInputs"],
    "loss_fn_output": ["LossFnOutput"],
    "loss_fn_type": ["LossFnType"],
    "model_id": ["ModelID"],
    "model_input": ["ModelInput"],
    "model_input_chunk": ["ModelInputChunk"],
    "optim_step_response": ["OptimStepResponse"],
    "optimizer": ["AdamParams"],
    "provenance_spans": ["PromptProvenanceSpan", "ProvenanceSpans", "SampledProvenanceSpan"],
    "sample_response": ["SampleResponse"],
    "sampled_sequence": ["SampledSequence"],
    "sampling_params": ["SamplingParams"],
    "save_weights_for_sampler_response": ["SaveWeightsForSamplerResponse"],
    "save_weights_response": ["SaveWeightsResponse"],
    "stop_reason": ["StopReason"],
    "tensor_data": ["TensorData"],
    "tensor_dtype": ["TensorDtype"],
    "training_run": ["TrainingRun"],
    "training_runs_response": ["TrainingRunsResponse"],
    "unload_model_response": ["UnloadModelResponse"],
    "weights_info_response": ["WeightsInfoResponse"],
}
SDK_PUBLIC_INTERFACES = ["APIFuture", "RestClient", "SamplingClient", "ServiceClient", "TrainingClient"]

# The SDK's top-level exceptions: name -> (direct base in the SDK, HTTP status or None).
SDK_EXCEPTIONS = {
    "TinkerError": ("Exception", None),
    "APIError": ("TinkerError", None),
    "APIResponseValidationError": ("APIError", None),
    "APIStatusError": ("APIError", None),
    "APIConnectionError": ("APIError", None),
    "APITimeoutError": ("APIConnectionError", None),
    "BadRequestError": ("APIStatusError", 400),
    "AuthenticationError": ("APIStatusError", 401),
    "BillingError": ("APIStatusError", 402),
    "PermissionDeniedError": ("APIStatusError", 403),
    "NotFoundError": ("APIStatusError", 404),
    "ConflictError": ("APIStatusError", 409),
    "UnprocessableEntityError": ("APIStatusError", 422),
    "RateLimitError": ("APIStatusError", 429),
    "InternalServerError": ("APIStatusError", 500),
    "RequestFailedError": ("TinkerError", None),
}


@pytest.mark.parametrize("module", sorted(SDK_TYPES_MODULES))
def test_sdk_types_submodule_paths(module):
    mod = importlib.import_module(f"tinker_cookbook.tinker.types.{module}")
    for name in SDK_TYPES_MODULES[module]:
        # One definition per name: the submodule re-exports the object defined in types/__init__.
        assert getattr(mod, name) is getattr(types, name), (module, name)


def test_sdk_public_interfaces_path():
    from tinker_cookbook.tinker.lib import public_interfaces

    for name in SDK_PUBLIC_INTERFACES:
        assert getattr(public_interfaces, name) is getattr(tinker, name)
    from tinker_cookbook.tinker.lib.public_interfaces.api_future import APIFuture

    assert APIFuture is tinker.APIFuture


@pytest.mark.parametrize("name", sorted(SDK_EXCEPTIONS))
def test_sdk_exception_names_and_shape(name):
    base_name, status = SDK_EXCEPTIONS[name]
    cls = getattr(tinker, name)
    base = Exception if base_name == "Exception" else getattr(tinker, base_name)
    assert issubclass(cls, base)
    if status is not None:
        assert cls.status_code == status
    # Raised with just a message, as local code does.
    assert str(cls("boom")) == "boom"


def test_local_validation_errors_are_sdk_status_errors():
    # An `except tinker.APIStatusError` clause from ported code catches the local engine's validation errors, and
    # `except ValueError` keeps working as well.
    with pytest.raises(tinker.APIStatusError) as info:
        tinker.ServiceClient(base_url="example.invalid")
    assert info.value.status_code == 400 and isinstance(info.value, ValueError)


# -- training calls --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


@pytest.fixture(scope="module")
def training_client(service) -> tinker.TrainingClient:
    return service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)


def _datum(seed: int, n: int = 7, k: int | None = None) -> types.Datum:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 2000, size=n).tolist()
    shape = (n,) if k is None else (n, k)
    targets = rng.integers(3, 2000, size=shape)
    weights = rng.uniform(0.0, 1.0, size=shape).astype(np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": targets.tolist(), "weights": weights.tolist()})


def _sum_loss(data, logprobs):
    loss = sum((lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs, strict=True))
    return -loss, {}


def test_forward_backward_custom_loss_type_input(training_client):
    data = [_datum(0), _datum(1)]
    plain = training_client.forward_backward_custom(data, _sum_loss).result()
    keyword = training_client.forward_backward_custom(data, _sum_loss, loss_type_input="logprobs").result()
    # The same request twice on unchanged weights (gradients only accumulate): identical results.
    assert keyword.metrics["loss:sum"] == plain.metrics["loss:sum"]
    with pytest.raises(BadRequestError, match="loss_type_input='probs'"):
        training_client.forward_backward_custom(data, _sum_loss, loss_type_input="probs")

    async def run_async():
        fut = await training_client.forward_backward_custom_async(data, _sum_loss, loss_type_input="logprobs")
        return await fut

    assert asyncio.run(run_async()).metrics["loss:sum"] == plain.metrics["loss:sum"]
    training_client.optim_step(types.AdamParams(learning_rate=0.0)).result()  # clear the accumulated gradients


def test_two_dimensional_target_tokens(training_client):
    """target_tokens of shape [n, k] (k candidate tokens per position, e.g. for distillation): logprobs come back
    in that shape, column j equal to the logprobs of the 1-D request with the j-th candidates."""
    n, k = 6, 3
    datum = _datum(2, n=n, k=k)
    out = training_client.forward([datum], "cross_entropy").result()
    logprobs = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert logprobs.shape == (n, k)
    targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
    weights = datum.loss_fn_inputs["weights"].to_numpy()
    for j in range(k):
        column = types.Datum(model_input=datum.model_input,
                             loss_fn_inputs={"target_tokens": targets[:, j], "weights": weights[:, j]})
        one_d = training_client.forward([column], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
        # Same hidden states, same logsumexp; only the gather differs: equal to float32 rounding of the logits.
        np.testing.assert_allclose(logprobs[:, j], one_d.to_numpy(), rtol=1e-5, atol=1e-5)
    # cross_entropy is the weighted sum over every entry.
    assert out.metrics["loss:sum"] == pytest.approx(-float((logprobs * weights).sum()), rel=1e-5)

    seen = []

    def loss_fn(data, lps):
        seen.extend(lp.shape for lp in lps)
        return _sum_loss(data, lps)

    custom = training_client.forward_backward_custom([datum], loss_fn).result()
    assert seen == [torch.Size([n, k])]
    assert custom.metrics["loss:sum"] == pytest.approx(out.metrics["loss:sum"], rel=1e-5)
    training_client.optim_step(types.AdamParams(learning_rate=0.0)).result()


def test_ragged_nested_list_names_row_lengths():
    with pytest.raises(ValueError, match=r"target_tokens'\] is a ragged nested list \(row lengths \[2, 1\]\)"):
        types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [[2, 3], [4]]})


def test_mismatched_loss_inputs_name_datum_and_lengths(training_client):
    good = _datum(3, n=5)
    bad = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8, 9]),
                      loss_fn_inputs={"target_tokens": [6, 7, 8, 9, 10], "weights": [[1.0, 1.0]] * 5})
    with pytest.raises(BadRequestError, match=r"data\[1\] .*model_input has 5 tokens; target_tokens \[5\], "
                                              r"weights \[5, 2\]"):
        training_client.forward_backward([good, bad], "cross_entropy").result()
    short = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0, 1.0]})
    with pytest.raises(BadRequestError, match=r"data\[2\]\.loss_fn_inputs\['weights'\] has shape \[2\] but "
                                              r"model_input has 3 tokens"):
        training_client.forward_backward([good, good, short], "cross_entropy").result()


# -- runs and paths ---------------------------------------------------------------------------------------------


def test_list_training_run_ids_and_hosted_path_form(service, training_client):
    rc = service.create_rest_client()
    ids = rc.list_training_run_ids(limit=1000).result()
    assert training_client.model_id in ids
    assert ids == [r.training_run_id for r in rc.list_training_runs(limit=1000).result().training_runs]
    assert asyncio.run(rc.list_training_run_ids_async(limit=1000)) == ids

    path = training_client.save_weights_for_sampler("compat").result().path
    run_id = training_client.model_id
    hosted = path.replace(f"tinker://{run_id}/", f"tinker://{run_id}:train:0/")
    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(hosted)
    assert (parsed.training_run_id, parsed.checkpoint_type, parsed.checkpoint_id) == (
        run_id, "sampler", "sampler_weights/compat")
    assert rc.get_training_run_by_tinker_path(hosted).result().training_run_id == run_id
    assert rc.get_weights_info_by_tinker_path(hosted).result().lora_rank == 4
    sampler = service.create_sampling_client(model_path=hosted)
    params = types.SamplingParams(max_tokens=2, temperature=0.0, seed=0)
    prompt = types.ModelInput.from_ints([5, 6, 7])
    assert sampler.sample(prompt, 1, params).result().sequences[0].tokens == service.create_sampling_client(
        model_path=path).sample(prompt, 1, params).result().sequences[0].tokens
    for bad in (f"tinker://{run_id}:train:/weights/x", f"tinker://{run_id}:eval:0/weights/x"):
        with pytest.raises(ValueError, match="malformed checkpoint path"):
            types.ParsedCheckpointTinkerPath.from_tinker_path(bad)


# -- cookbook ----------------------------------------------------------------------------------------------------


class _DocsStyleDataset(RLDataset):
    """An RL dataset written as the docs show it: only get_batch, slicing a list (empty past the end)."""

    def __init__(self, n_problems: int, batch_size: int) -> None:
        self.problems = list(range(n_problems))
        self.batch_size = batch_size
        self.calls = 0

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        self.calls += 1
        chunk = self.problems[index * self.batch_size : (index + 1) * self.batch_size]
        return [_NoEnvs() for _ in chunk]


class _NoEnvs(EnvGroupBuilder):
    async def make_envs(self):
        return []


@pytest.mark.parametrize(("n_problems", "batch_size", "expected"), [(0, 4, 0), (1, 4, 1), (8, 4, 2), (9, 4, 3),
                                                                     (1000, 3, 334), (64, 1, 64)])
def test_rl_dataset_with_only_get_batch(n_problems, batch_size, expected):
    dataset = _DocsStyleDataset(n_problems, batch_size)
    assert len(dataset) == expected
    assert dataset.calls <= 2 * max(expected, 1).bit_length() + 2  # a bisection, not a scan


def test_rl_dataset_that_never_ends_asks_for_len():
    class Endless(RLDataset):
        def get_batch(self, index: int) -> list[EnvGroupBuilder]:
            return [_NoEnvs()]

    with pytest.raises(TypeError, match="define __len__"):
        len(Endless())


def test_rl_dataset_ending_with_index_error():
    class Indexed(RLDataset):
        def get_batch(self, index: int) -> list[EnvGroupBuilder]:
            return [[_NoEnvs()], [_NoEnvs()], [_NoEnvs()]][index]

    assert len(Indexed()) == 3


def test_sdk_038_call_forms(training_client):
    """0.38's forms: client-creating methods return futures of the client (``.result()``), ``optim_step`` takes
    ``optim_params`` or the older ``adam_params=``; options this engine lacks are refused by name."""
    sampler = training_client.save_weights_and_get_sampling_client().result()
    assert isinstance(sampler, tinker.SamplingClient) and asyncio.run(_awaited(sampler)) is sampler
    training_client.forward_backward([_datum(3)], "cross_entropy").result()
    assert training_client.optim_step(optim_params=types.AdamParams(learning_rate=1e-4)).result().metrics
    training_client.forward_backward([_datum(4)], "cross_entropy").result()
    assert training_client.optim_step(adam_params=types.AdamParams(learning_rate=1e-4)).result().metrics
    with pytest.raises(BadRequestError, match="not both"):
        training_client.optim_step(types.AdamParams(), adam_params=types.AdamParams()).result()
    with pytest.raises(BadRequestError, match="record_stability_info=True is not supported.*stable_reinforce"):
        training_client.save_weights_and_get_sampling_client(record_stability_info=True)
    with pytest.raises(BadRequestError, match="kind='inflight' is not supported"):
        training_client.save_weights_and_get_sampling_client(kind="inflight")
    with pytest.raises(BadRequestError, match="only AdamW"):
        tinker.ServiceClient().create_lora_training_client(MODEL, rank=4, optimizer={"type": "dimuon"})


async def _awaited(sampler):
    return await sampler


def test_in_process_provenance(training_client):
    """Sampled sequences carry ids; datums built from them with ``with_provenance`` train, and spans that name an
    unknown sequence or leave theirs are refused before anything runs, naming the field."""
    sampler = training_client.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([5, 6, 7, 8])
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=1)
    sequence = sampler.sample(prompt, 1, params).result().sequences[0]
    assert sequence.sequence_id and sequence.sequence_id.startswith("seq-")
    tokens = sequence.tokens
    datum = types.Datum(model_input=prompt.append(types.EncodedTextChunk(tokens=tokens[:-1])),
                        loss_fn_inputs={"target_tokens": [0] * 3 + tokens, "logprobs": [0.0] * 3 + sequence.logprobs,
                                        "advantages": [0.0] * 3 + [1.0] * len(tokens)})
    sid = sequence.sequence_id
    with pytest.raises(ValueError, match="with_provenance model_input covers 4 positions but the datum has"):
        datum.with_provenance(model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=4)],
                              loss_fn_inputs=[])
    traced = datum.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=4),
                     types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens) - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=3),
                        types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens))])
    out = training_client.forward([traced], "importance_sampling").result()
    assert len(out.loss_fn_outputs[0]["logprobs"].data) == traced.model_input.length
    assert types.Datum.model_validate_json(traced.model_dump_json()) == traced  # spans survive JSON
    unknown = traced.model_copy(update={"model_input_spans": [
        types.PromptProvenanceSpan(sequence_id="seq-unknown", length=4), *traced.model_input_spans[1:]]})
    with pytest.raises(BadRequestError, match=r"data\[0\]\.model_input_spans\[0\]\.sequence_id='seq-unknown'"):
        training_client.forward([unknown], "importance_sampling").result()
    beyond = traced.model_copy(update={"loss_fn_input_spans": [
        types.PromptProvenanceSpan(sequence_id=sid, offset=0, length=3),
        types.SampledProvenanceSpan(sequence_id=sid, offset=1, length=len(tokens))]})
    with pytest.raises(BadRequestError, match=rf"loss_fn_input_spans\[1\] covers positions \[1, {1 + len(tokens)}\) of the sampled"):
        training_client.forward([beyond], "importance_sampling").result()
    with pytest.raises(ValueError, match="provenance comes as a pair"):
        types.Datum(model_input=prompt, loss_fn_inputs={"target_tokens": [1, 2, 3, 4]},
                    model_input_spans=[types.PromptProvenanceSpan(sequence_id=sid, length=4)])
