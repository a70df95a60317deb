"""The API types: names, defaults and conversions users rely on."""

import asyncio
import base64
import concurrent.futures

import numpy as np
import pytest
import torch

from tinker_cookbook import tinker
from tinker_cookbook.tinker import types


def test_model_input_helpers():
    mi = types.ModelInput.from_ints([1, 2, 3])
    assert mi.to_ints() == [1, 2, 3] and mi.length == 3
    longer = mi.append_int(4).append(types.EncodedTextChunk(tokens=[5, 6]))
    assert longer.to_ints() == [1, 2, 3, 4, 5, 6] and longer.length == 6
    assert mi.length == 3  # append returns a new object
    assert types.ModelInput.empty().length == 0


def test_image_chunks():
    png = b"\x89PNG fake"
    chunk = types.ImageChunk(data=base64.b64encode(png).decode(), format="png", expected_tokens=16)
    assert chunk.data == png and chunk.length == 16
    assert types.ImageChunk.model_validate(chunk.model_dump(mode="json")).data == png
    mi = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1]), chunk])
    assert mi.length == 17
    with pytest.raises(ValueError, match="EncodedTextChunk"):
        mi.to_ints()
    with pytest.raises(ValueError, match="expected_tokens"):
        types.ImageAssetPointerChunk(format="jpeg", location="x.jpg").length
    # chunks deserialize by their "type" discriminator
    parsed = types.ModelInput.model_validate({"chunks": [{"type": "encoded_text", "tokens": [7]},
                                                         {"type": "image", "data": "", "format": "png"}]})
    assert isinstance(parsed.chunks[1], types.ImageChunk)


def test_tensor_data_roundtrip():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    td = types.TensorData.from_numpy(arr)
    assert td.dtype == "float32" and td.shape == [2, 3]
    np.testing.assert_array_equal(td.to_numpy(), arr)
    t = torch.tensor([1, 2, 3])
    td = types.TensorData.from_torch(t)
    assert td.dtype == "int64" and torch.equal(td.to_torch(), t) and td.tolist() == [1, 2, 3]


def test_datum_converts_by_key():
    d = types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs=dict(
        target_tokens=np.array([2, 3], dtype=np.int32), weights=[1, 0], advantages=torch.tensor([0.5, 1.0]),
        logprobs=np.array([-1.0, -2.0], dtype=np.float64)))
    li = d.loss_fn_inputs
    assert li["target_tokens"].dtype == "int64" and li["target_tokens"].tolist() == [2, 3]
    assert li["weights"].dtype == "float32" and li["weights"].tolist() == [1.0, 0.0]
    assert li["advantages"].dtype == "float32" and li["logprobs"].dtype == "float32"
    with pytest.raises(ValueError):
        types.Datum(model_input=types.ModelInput.from_ints([1]), loss_fn_inputs={}, extra_field=1)


def test_defaults_match_docs():
    adam = types.AdamParams()
    assert (adam.learning_rate, adam.beta1, adam.beta2, adam.eps, adam.weight_decay, adam.grad_clip_norm) == (
        1e-4, 0.9, 0.95, 1e-12, 0.0, 0.0)
    sp = types.SamplingParams()
    assert (sp.max_tokens, sp.seed, sp.stop, sp.temperature, sp.top_k, sp.top_p) == (None, None, None, 1.0, -1, 1.0)
    lora = types.LoraConfig(rank=8)
    assert (lora.seed, lora.train_unembed, lora.train_mlp, lora.train_attn) == (None, True, True, True)


def test_parsed_tinker_path():
    p = types.ParsedCheckpointTinkerPath.from_tinker_path("tinker://run-1/sampler_weights/final")
    assert (p.training_run_id, p.checkpoint_type, p.checkpoint_id) == ("run-1", "sampler", "sampler_weights/final")
    for bad in ["tinker://run/weights/../x", "s3://run/weights/x", "tinker://run/weights/", "tinker://run/foo/x"]:
        with pytest.raises(ValueError, match="tinker://"):
            types.ParsedCheckpointTinkerPath.from_tinker_path(bad)


def test_api_future_sync_async_timeout_and_map():
    raw: concurrent.futures.Future = concurrent.futures.Future()
    fut = tinker.APIFuture(raw)
    with pytest.raises(tinker.APITimeoutError):
        fut.result(timeout=0.01)
    doubled = fut.map(lambda v: v * 2)
    raw.set_result(21)
    assert fut.result() == 21 and doubled.result() == 42

    async def wait():
        return await tinker.APIFuture.completed(5), await tinker.APIFuture.completed(6).result_async()

    assert asyncio.run(wait()) == (5, 6)
    failed = tinker.APIFuture.failed(tinker.BadRequestError("bad"))
    with pytest.raises(tinker.BadRequestError):
        failed.result()


def test_error_hierarchy():
    assert issubclass(tinker.BadRequestError, tinker.TinkerError) and issubclass(tinker.BadRequestError, ValueError)
    assert issubclass(tinker.NotFoundError, tinker.APIError)


def test_base_url_that_is_no_server_url_is_rejected():
    # A URL selects a remote server (tests/server); anything else that is not the local engine is a clear error.
    with pytest.raises(tinker.BadRequestError, match="base_url"):
        tinker.ServiceClient(base_url="example.invalid")
