"""Qwen3-VL-MoE with images on the engine's general path (tiny-qwen3-vl-moe: tiny-qwen3-vl's vision tower and
multimodal rope over a decoder of routed experts): training against the transformers + peft forward, sampling
against training, a checkpoint's round trip and a short run, each with an image in the prompt.

Tolerances: everything runs in fp32 with the same weights; the sides differ only in the order of floating-point
operations (peft's forward against the engine's chunked head, a KV-cached decode against a full forward, a merged
adapter against an unmerged one), ~1e-6 on logprobs of ~-12 (observed <= 1e-6). 1e-4 leaves room for other BLAS
builds and thread counts, while a wrong image position, rope delta or routing moves logprobs by 1e-2 or more.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.engine.tiny_sessions import fp32_sampling_weights
from tinker_cookbook.base.tokenizers import get_tokenizer
from tinker_cookbook.engine import models, vision
from tinker_cookbook.engine.sampling.general import GeneralModel
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.engine.store import files
from tinker_cookbook.engine.training.general import v5_targets
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-qwen3-vl-moe"
TOLERANCE = 1e-4


def _png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buffer, format="PNG")
    return buffer.getvalue()


RED, BLUE = _png((220, 30, 30)), _png((30, 30, 220))
TOKENIZER = get_tokenizer(MODEL)


def _prompt(image: bytes, question: str = "Colour?") -> types.ModelInput:
    """The docs' low-level layout: chat header, <|vision_start|>, the image, <|vision_end|>, the question."""
    return types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=TOKENIZER.encode("<|im_start|>user\n<|vision_start|>")),
        types.ImageChunk(data=image, format="png"),
        types.EncodedTextChunk(tokens=TOKENIZER.encode(f"<|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n")),
    ])


TEXT = types.ModelInput.from_ints(TOKENIZER.encode("<|im_start|>user\nNo picture here.<|im_end|>\n<|im_start|>"))


def _ids(base: BaseModel, model_input: types.ModelInput) -> tuple[list[int], tuple[vision.PreparedImage, ...]]:
    assert base.image_inputs is not None
    return base.image_inputs.expand(model_input, "model_input")


def _datum(base: BaseModel, prompt: types.ModelInput, completion: list[int]) -> types.Datum:
    """Next-token datum of ``prompt`` + ``completion`` (every target weighted 1): the input is all but the last token
    (the prompt ends in text), the targets all but the first."""
    ids, _ = _ids(base, prompt)
    full = ids + completion
    chunks = [*prompt.chunks, types.EncodedTextChunk(tokens=completion)] if completion else list(prompt.chunks)
    last = chunks[-1]
    assert isinstance(last, types.EncodedTextChunk)
    model_input = types.ModelInput(chunks=[*chunks[:-1], types.EncodedTextChunk(tokens=list(last.tokens)[:-1])])
    return types.Datum(model_input=model_input,
                       loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})


def _logprobs(session: TrainingSession, prompt: types.ModelInput, completion: list[int]) -> torch.Tensor:
    out = session.forward([_datum(session.base, prompt, completion)], "cross_entropy", None, backward=False)
    return torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist())


ANSWER = TOKENIZER.encode("red<|im_end|>")


def _train(session: TrainingSession, steps: int, lr: float) -> list[float]:
    data = [_datum(session.base, _prompt(RED), ANSWER), _datum(session.base, _prompt(BLUE), TOKENIZER.encode(
        "blue<|im_end|>")), _datum(session.base, TEXT, TOKENIZER.encode("assistant\nhi<|im_end|>"))]
    losses = []
    for _ in range(steps):
        out = session.forward(data, "cross_entropy", None, backward=True)
        losses.append(out.metrics["loss:sum"])
        session.optim_step(types.AdamParams(learning_rate=lr))
    return losses


@pytest.fixture(scope="module")
def trained() -> TrainingSession:
    """A session after two steps on images and text (its LoRA B no longer zero)."""
    base = BaseModel(models.get_model_spec(MODEL), models.load_model(MODEL, torch.float32), torch.float32)
    session = TrainingSession("a", base, types.LoraConfig(rank=4, seed=3))
    _train(session, steps=2, lr=1e-2)
    return session


def test_the_general_path_adapts_the_language_model_only(trained: TrainingSession) -> None:
    assert trained.base.general and trained.base.image_inputs is not None
    keys = list(trained.base.adapter_state(trained.run_id))
    assert any(".experts." in k for k in keys) and any("self_attn" in k for k in keys)
    assert all(".language_model." in k or ".lm_head." in k for k in keys)  # never the vision tower
    assert not any(k.split(".")[-3] in ("gate", "router") for k in keys)


def test_training_logprobs_equal_the_peft_forward_with_an_image(trained: TrainingSession) -> None:
    import peft

    config = peft.LoraConfig.from_peft_type(**trained.base.adapter_config_dict(trained.run_id))
    with v5_targets():
        reference = peft.get_peft_model(models.load_model(MODEL, torch.float32), config)
    peft.set_peft_model_state_dict(reference, trained.base.adapter_state(trained.run_id))
    prompt = _prompt(RED)
    ids, images = _ids(trained.base, prompt)
    pixel_values, grid = vision.image_batch(images)
    tokens = torch.tensor([ids + ANSWER[:-1]])
    with torch.no_grad():
        logits = reference(input_ids=tokens, pixel_values=pixel_values, image_grid_thw=grid,
                           mm_token_type_ids=(tokens == trained.base.config.image_token_id).int()).logits[0]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids[1:] + ANSWER)[:, None])[:, 0]
    engine = _logprobs(trained, prompt, ANSWER)
    assert (engine - expected).abs().max() < TOLERANCE
    # The image matters: another one moves the logprobs after it.
    assert (_logprobs(trained, _prompt(BLUE), ANSWER) - engine).abs().max() > 100 * TOLERANCE


def test_a_lora_step_changes_only_adapter_weights(trained: TrainingSession) -> None:
    session = TrainingSession("step", trained.base, types.LoraConfig(rank=4, seed=5))
    base_before = {k: v.clone() for k, v in session.base.base_state.items()}
    adapter_before = session.base.adapter_state(session.run_id)
    _train(session, steps=1, lr=1e-2)
    assert all(torch.equal(base_before[k], v) for k, v in session.base.base_state.items())  # tower, routers too
    adapter_after = session.base.adapter_state(session.run_id)
    changed = [k for k in adapter_before if not torch.equal(adapter_before[k], adapter_after[k])]
    assert any(".experts." in k for k in changed) and any("self_attn" in k for k in changed)
    session.base.remove_adapter("step")


def test_sampled_and_prompt_logprobs_equal_training_logprobs(trained: TrainingSession) -> None:
    weights = fp32_sampling_weights(trained)
    assert isinstance(weights.decoder, GeneralModel) and weights.limits.accepts_images
    params = types.SamplingParams(max_tokens=6, seed=5)
    with SamplerEngine() as engine:
        red, blue, text = (engine.submit(weights, TOKENIZER, prompt, 2, params, include_prompt_logprobs=True)
                           for prompt in (_prompt(RED), _prompt(BLUE), TEXT))
        results = [red.result(), blue.result(), text.result()]
    for prompt, response in zip((_prompt(RED), _prompt(BLUE), TEXT), results, strict=True):
        ids, _ = _ids(trained.base, prompt)
        # Prompt logprobs: None first and at the image placeholders, the trainer's at every text position.
        assert response.prompt_logprobs is not None
        blank = [i for i, value in enumerate(response.prompt_logprobs) if value is None]
        assert blank == [0] + [i for i, t in enumerate(ids) if t == trained.base.config.image_token_id]
        expected = _logprobs(trained, prompt, [])
        for position, value in enumerate(response.prompt_logprobs):
            if value is not None:
                assert abs(value - expected[position - 1].item()) < TOLERANCE
        # Sampled logprobs: decoding continues at the positions after the image (the prompt's rope delta).
        for sequence in response.sequences:
            full = _logprobs(trained, prompt, sequence.tokens)
            assert (torch.tensor(sequence.logprobs) - full[len(ids) - 1:]).abs().max() < TOLERANCE
    # Same tokens, another image: their own prefill, their own logprobs.
    red_lp, blue_lp = results[0].prompt_logprobs, results[1].prompt_logprobs
    assert red_lp is not None and blue_lp is not None
    assert max(abs(a - b) for a, b in zip(red_lp, blue_lp, strict=True) if a is not None and b is not None) > 1e-3


def test_save_and_load_round_trip(trained: TrainingSession, tmp_path: Path) -> None:
    trained.write_state(tmp_path)
    config = files.read_json(tmp_path / files.ADAPTER_CONFIG_FILE, "config")
    assert config["peft_type"] == "LORA" and config["target_parameters"]
    fresh = TrainingSession("loaded", trained.base, trained.lora)
    fresh.load_state(tmp_path, with_optimizer=True, source="test")
    assert torch.equal(_logprobs(fresh, _prompt(RED), ANSWER), _logprobs(trained, _prompt(RED), ANSWER))
    state, adapter_config = files.read_sampler_adapter(tmp_path, "test", trained.base.base_state, "tiny")
    weights = SamplingWeights.build(trained.base.config, trained.base.base_state, state, adapter_config, torch.float32)
    with SamplerEngine() as engine:
        response = engine.submit(weights, TOKENIZER, _prompt(RED), 1, types.SamplingParams(max_tokens=1),
                                 include_prompt_logprobs=True).result()
    expected = _logprobs(trained, _prompt(RED), [])
    got = response.prompt_logprobs
    assert got is not None
    assert max(abs(v - expected[i - 1].item()) for i, v in enumerate(got) if v is not None) < TOLERANCE
    trained.base.remove_adapter("loaded")


def test_a_short_supervised_run_on_images_lowers_the_loss(trained: TrainingSession) -> None:
    session = TrainingSession("sl", trained.base, types.LoraConfig(rank=4, seed=7))
    losses = _train(session, steps=6, lr=2e-2)
    assert losses[-1] < 0.7 * losses[0]
    session.base.remove_adapter("sl")
