"""Image inputs on the tiny Qwen3-VL model: training and sampling agree with the transformers forward and with each
other, images mix with text in batches and concurrent requests, and bad image input fails clearly."""

from __future__ import annotations

import base64
import concurrent.futures
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from tinker_cookbook import tinker
from tinker_cookbook.base.tokenizers import get_tokenizer
from tinker_cookbook.engine import vision
from tinker_cookbook.engine.models import load_model
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, UnprocessableEntityError

MODEL = "tinker-cookbook/tiny-qwen3-vl"
# Both sides compute in fp32 with the same weights; they differ only in the order of floating-point operations
# (the sampler's fused q|k|v and gate|up matmuls, packed prompts, chunked unembedding), which moves logprobs of a
# 2-layer model with logits of order 1 by ~1e-6. 1e-4 leaves a wide margin for other thread counts.
TOLERANCE = 1e-4


def _png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


RED, BLUE = _png((220, 30, 30)), _png((30, 30, 220))


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return get_tokenizer(MODEL)


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


@pytest.fixture(scope="module")
def training(service: tinker.ServiceClient) -> tinker.TrainingClient:
    return service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)


@pytest.fixture(scope="module")
def sampling(training: tinker.TrainingClient) -> tinker.SamplingClient:
    """A sampler of an adapter trained a few steps on images, so that the LoRA deltas are not zero; fp32."""
    data = [_datum(_prompt(_tokenizer(), RED, "Colour?"), "red"), _datum(_prompt(_tokenizer(), BLUE, "Colour?"), "blue")]
    for _ in range(2):
        training.forward_backward(data, "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_COOKBOOK_SAMPLER_DTYPE", "fp32")
        return training.save_weights_and_get_sampling_client(name="vision-test")


def _tokenizer() -> Any:
    return get_tokenizer(MODEL)


def _prompt(tokenizer: Any, image: bytes | types.ImageAssetPointerChunk, question: str,
            expected_tokens: int | None = None) -> types.ModelInput:
    """The docs' low-level layout: chat header, <|vision_start|>, the image, <|vision_end|>, the question."""
    chunk = image if isinstance(image, types.ImageAssetPointerChunk) else types.ImageChunk(
        data=image, format="png", expected_tokens=expected_tokens)
    return types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=tokenizer.encode("<|im_start|>user\n<|vision_start|>")),
        chunk,
        types.EncodedTextChunk(tokens=tokenizer.encode(f"<|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n")),
    ])


def _datum(prompt: types.ModelInput, answer: str) -> types.Datum:
    """Next-token datum of prompt + answer: inputs all but the last token, targets shifted by one."""
    tokenizer = _tokenizer()
    answer_tokens = tokenizer.encode(answer + "<|im_end|>")
    full_ids, _ = _expand(prompt.append(types.EncodedTextChunk(tokens=answer_tokens)))
    model_input = prompt.append(types.EncodedTextChunk(tokens=answer_tokens[:-1]))
    n = len(full_ids) - 1
    weights = [0.0] * (n - len(answer_tokens)) + [1.0] * len(answer_tokens)
    return types.Datum(model_input=model_input, loss_fn_inputs={"target_tokens": full_ids[1:], "weights": weights})


def _expand(model_input: types.ModelInput) -> tuple[list[int], tuple[vision.PreparedImage, ...]]:
    inputs = vision.image_inputs_for(MODEL, "tiny", load_model_config())
    assert inputs is not None
    return inputs.expand(model_input, "model_input")


def load_model_config() -> Any:
    from tinker_cookbook.engine.models import load_model_config as load

    return load(MODEL)


def _logprobs(training: tinker.TrainingClient, data: list[types.Datum]) -> list[torch.Tensor]:
    out = training.forward(data, "cross_entropy").result()
    return [o["logprobs"].to_torch() for o in out.loss_fn_outputs]


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return load_model(MODEL, torch.float32)


def test_training_logprobs_match_the_transformers_forward(service: tinker.ServiceClient, reference: Any,
                                                         tokenizer: Any) -> None:
    # A fresh adapter is zero, so the engine's logprobs must be the base model's, image features and multimodal
    # positions included: compare with the HF model's own forward on the processor's pixels.
    client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=1)
    datum = _datum(_prompt(tokenizer, RED, "What colour is this?"), "red")
    [engine_logprobs] = _logprobs(client, [datum])
    ids, images = _expand(datum.model_input)
    pixel_values, grid = vision.image_batch(images)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = reference(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid,
                           mm_token_type_ids=(input_ids == reference.config.image_token_id).int()).logits[0]
    targets = datum.loss_fn_inputs["target_tokens"].to_torch()
    expected = torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])[:, 0]
    assert (engine_logprobs - expected).abs().max().item() < TOLERANCE
    # The image matters: another image changes the logprobs after it.
    [other] = _logprobs(client, [_datum(_prompt(tokenizer, BLUE, "What colour is this?"), "red")])
    assert (other - engine_logprobs).abs().max().item() > 100 * TOLERANCE


def test_mixed_text_and_image_batch_equals_each_alone(training: tinker.TrainingClient, tokenizer: Any) -> None:
    text = types.ModelInput.from_ints(tokenizer.encode("<|im_start|>user\nNo picture here.<|im_end|>\n"))
    data = [
        _datum(_prompt(tokenizer, RED, "Colour?"), "red"),
        _datum(text, "fine"),
        _datum(_prompt(tokenizer, BLUE, "Colour?"), "blue"),  # same length as the first: one padded group
    ]
    together = _logprobs(training, data)
    alone = [_logprobs(training, [d])[0] for d in data]
    for batched, single in zip(together, alone, strict=True):
        assert (batched - single).abs().max().item() < TOLERANCE
    out = training.forward_backward(data, "cross_entropy").result()
    assert torch.isfinite(torch.tensor(out.metrics["loss:sum"]))


def test_sampler_agrees_with_training_on_images(training: tinker.TrainingClient, sampling: tinker.SamplingClient,
                                                tokenizer: Any) -> None:
    prompt = _prompt(tokenizer, RED, "Colour?")
    result = sampling.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=4, seed=3),
                             include_prompt_logprobs=True).result()
    n_prompt = len(_expand(prompt)[0])
    for sequence in result.sequences:
        # Training logprobs of the sampled tokens (after the prompt) must equal the sampler's.
        tokens = sequence.tokens
        prompt_ids, _ = _expand(prompt)
        datum = types.Datum(
            model_input=prompt.append(types.EncodedTextChunk(tokens=tokens[:-1])),
            loss_fn_inputs={"target_tokens": prompt_ids[1:] + tokens,
                            "weights": [0.0] * (n_prompt + len(tokens) - 1)},
        )
        [trained] = _logprobs(training, [datum])
        assert torch.allclose(trained[n_prompt - 1:], torch.tensor(sequence.logprobs), atol=TOLERANCE, rtol=0)
    # Prompt logprobs: None first and at the image placeholders, the training logprobs at every text position.
    prompt_ids, _ = _expand(prompt)
    logprobs = result.prompt_logprobs
    assert logprobs is not None and len(logprobs) == len(prompt_ids)
    placeholder = load_model_config().image_token_id
    assert [i for i, lp in enumerate(logprobs) if lp is None] == [0] + [
        i for i, t in enumerate(prompt_ids) if t == placeholder]
    datum = types.Datum(model_input=types.ModelInput(chunks=prompt.chunks[:-1] + [types.EncodedTextChunk(
        tokens=prompt.chunks[-1].tokens[:-1])]),  # type: ignore[union-attr]
        loss_fn_inputs={"target_tokens": prompt_ids[1:], "weights": [0.0] * (len(prompt_ids) - 1)})
    [trained] = _logprobs(training, [datum])
    for position, value in enumerate(logprobs):
        if value is not None:
            assert abs(value - trained[position - 1].item()) < TOLERANCE


def test_concurrent_image_and_text_requests_each_get_their_own_answer(
        sampling: tinker.SamplingClient, tokenizer: Any) -> None:
    # Same tokens, different images: they must not share a prefill (nor a result); text prompts batch alongside.
    prompts = [_prompt(tokenizer, RED, "Colour?"), _prompt(tokenizer, BLUE, "Colour?"),
               types.ModelInput.from_ints(tokenizer.encode("<|im_start|>user\nHello<|im_end|>\n"))]
    params = types.SamplingParams(max_tokens=3, temperature=0.0)

    def run(prompt: types.ModelInput) -> types.SampleResponse:
        return sampling.sample(prompt, num_samples=1, sampling_params=params, include_prompt_logprobs=True).result()

    alone = [run(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts) * 2) as pool:
        together = list(pool.map(run, prompts * 2))
    for index, response in enumerate(together):
        expected = alone[index % len(prompts)]
        assert response.sequences[0].tokens == expected.sequences[0].tokens
        got, want = response.prompt_logprobs, expected.prompt_logprobs
        assert got is not None and want is not None
        assert all((a is None) == (b is None) and (a is None or abs(a - b) < TOLERANCE)
                   for a, b in zip(got, want, strict=True))
    red, blue = alone[0].prompt_logprobs, alone[1].prompt_logprobs
    assert red is not None and blue is not None
    assert max(abs(a - b) for a, b in zip(red, blue, strict=True) if a is not None and b is not None) > 1e-3


def test_asset_pointers_to_local_files_and_data_urls_equal_image_chunks(
        sampling: tinker.SamplingClient, tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "red.png"
    path.write_bytes(RED)
    data_url = "data:image/png;base64," + base64.b64encode(RED).decode()
    params = types.SamplingParams(max_tokens=1, temperature=0.0)
    results = [
        sampling.sample(_prompt(tokenizer, image, "Colour?"), num_samples=1, sampling_params=params,
                        include_prompt_logprobs=True).result().prompt_logprobs
        for image in [RED, types.ImageAssetPointerChunk(format="png", location=str(path)),
                      types.ImageAssetPointerChunk(format="png", location=path.as_uri()),
                      types.ImageAssetPointerChunk(format="png", location=data_url)]
    ]
    assert all(r == results[0] for r in results[1:])


def test_bad_image_input_names_the_field_and_the_fix(training: tinker.TrainingClient,
                                                     sampling: tinker.SamplingClient, tokenizer: Any) -> None:
    ok_tokens = _expand(_prompt(tokenizer, RED, "?"))[1][0].num_tokens
    cases = [
        (_prompt(tokenizer, RED, "?", expected_tokens=ok_tokens + 1), rf"chunks\[1\]\.expected_tokens={ok_tokens + 1}.*"
                                                                      rf"expected_tokens={ok_tokens}"),
        (_prompt(tokenizer, b"\x89PNG not really", "?"), r"chunks\[1\] is not a readable image"),
        (_prompt(tokenizer, types.ImageAssetPointerChunk(format="png", location="https://example.invalid/x.png"),
                 "?"), r"chunks\[1\]\.location=.*remote URL"),
        (_prompt(tokenizer, types.ImageAssetPointerChunk(format="png", location="/no/such/image.png"), "?"),
         r"chunks\[1\]\.location=.*cannot be read"),
        (types.ModelInput.from_ints(tokenizer.encode("<|image_pad|>")), r"chunks\[0\].*placeholder token"),
    ]
    for prompt, message in cases:
        with pytest.raises(BadRequestError, match=message):
            sampling.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=1)).result()
        datum = types.Datum(model_input=prompt, loss_fn_inputs={"target_tokens": [0] * 3, "weights": [0.0] * 3})
        with pytest.raises(BadRequestError, match=r"data\[0\]\.model_input\." + message):
            training.forward([datum], "cross_entropy").result()


def test_text_only_model_refuses_images(service: tinker.ServiceClient, tokenizer: Any) -> None:
    name = "tinker-cookbook/tiny-qwen3"
    prompt = _prompt(tokenizer, RED, "Colour?", expected_tokens=70)
    sampler = service.create_sampling_client(base_model=name)
    with pytest.raises(UnprocessableEntityError, match=r"prompt\.chunks\[1\] is an ImageChunk.*text-only.*Qwen3-VL"):
        sampler.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=1)).result()
    client = service.create_lora_training_client(base_model=name, rank=4, seed=0)
    datum = types.Datum(model_input=prompt, loss_fn_inputs={"target_tokens": [0] * prompt.length,
                                                            "weights": [0.0] * prompt.length})
    with pytest.raises(UnprocessableEntityError, match=rf"data\[0\]\.model_input\.chunks\[1\].*{name}.*text-only"):
        client.forward([datum], "cross_entropy").result()


def test_snapshots_of_one_base_share_its_vision_tower() -> None:
    """Sampler snapshots of one base (with or without a LoRA adapter: LoRA adapts the language model only) get the
    same vision tower object instead of a copy each; another base's tensors get their own; a dropped tower is not
    kept alive by the cache."""
    import gc
    import weakref

    from tinker_cookbook.engine.sampling.weights import SamplingWeights

    model = load_model(MODEL)
    state = dict(model.state_dict())
    first = SamplingWeights.build(model.config, state, None, None, torch.float32)
    second = SamplingWeights.build(model.config, dict(state), None, None, torch.float32)
    assert first.limits.vision is not None and first.limits.vision is second.limits.vision
    other = SamplingWeights.build(model.config, {k: v.clone() for k, v in state.items()}, None, None, torch.float32)
    assert other.limits.vision is not first.limits.vision
    tower = weakref.ref(first.limits.vision)
    del first, second
    gc.collect()
    assert tower() is None
