"""Qwen3-VL: images become ImageChunks of the right size, and a tiny random Qwen3-VL model runs on the result."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.image_processing_utils import (
    get_image_processor,
    image_chunk_pixels,
    image_to_data_uri,
    num_image_tokens,
    resize_image,
)
from tinker_cookbook.renderers import Message, Qwen3VLRenderer, TrainOnWhat, get_renderer
from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import Tokenizer

IMAGE_PAD_ID = 151655


def _png(height: int, width: int) -> bytes:
    """A real PNG: a colour gradient, so the processor sees actual pixel data."""
    image = Image.new("RGB", (width, height))
    image.putdata([(x * 255 // width, y * 255 // height, 128) for y in range(height) for x in range(width)])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def renderer(qwen3_tokenizer: Tokenizer) -> Qwen3VLRenderer:
    vl = get_renderer("qwen3_vl_instruct", qwen3_tokenizer, model_name="tinker-cookbook/tiny-qwen3-vl")
    assert vl.image_processor is not None  # type: ignore[attr-defined]
    return vl  # type: ignore[return-value]


def _question(image: object) -> list[Message]:
    return [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "What is this?"}],
        }
    ]


def test_processor_is_qwen3_vl_offline() -> None:
    processor = get_image_processor("Qwen/Qwen3-VL-30B-A3B-Instruct")
    assert (processor.patch_size, processor.merge_size, processor.temporal_patch_size) == (16, 2, 2)
    # Hand-computed: sides rounded to multiples of 32 (patch 16 x merge 2) -> grid of 16x16 patches,
    # 4 patches per token. 320x480 -> 20x30 patches -> 150 tokens. 50x60 is below the 256x256 pixel minimum:
    # scaled by sqrt(65536 / 3000) and rounded up -> 256x288 -> 16x18 patches -> 72 tokens.
    assert num_image_tokens(processor, 320, 480) == 150
    assert num_image_tokens(processor, 50, 60) == 72


def test_image_message_renders_vision_tokens(renderer: Qwen3VLRenderer, qwen3_tokenizer: Tokenizer) -> None:
    data = _png(320, 480)
    prompt = renderer.build_generation_prompt(_question(data))
    before, image, after = prompt.chunks
    assert isinstance(image, types.ImageChunk)
    assert (image.format, image.expected_tokens, image.data) == ("png", 150, data)
    assert qwen3_tokenizer.decode(before.tokens) == "<|im_start|>user\n<|vision_start|>"  # type: ignore[union-attr]
    assert qwen3_tokenizer.decode(after.tokens) == (  # type: ignore[union-attr]
        "<|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt.length == len(before.tokens) + 150 + len(after.tokens)  # type: ignore[union-attr]


def test_image_sources_agree(renderer: Qwen3VLRenderer, tmp_path: Path) -> None:
    data = _png(50, 60)
    path = tmp_path / "img.png"
    path.write_bytes(data)
    pil = Image.open(io.BytesIO(data))
    uri = image_to_data_uri(data)
    assert uri == "data:image/png;base64," + base64.b64encode(data).decode()
    for source in (data, pil, uri, str(path)):
        image = renderer.build_generation_prompt(_question(source)).chunks[1]
        assert isinstance(image, types.ImageChunk) and image.expected_tokens == 72
    with pytest.raises(RendererError, match="ImagePart.image must be"):
        renderer.build_generation_prompt(_question(12345))
    with pytest.raises(RendererError, match="ImagePart.image must be"):
        renderer.build_generation_prompt(_question("x" * 5000))  # neither a URL nor an existing file
    # Port 9 (discard) on localhost refuses at once: the download error names the URL and the alternatives.
    with pytest.raises(RendererError, match=r"could not download image 'http://127.0.0.1:9/a.png'.*bytes"):
        renderer.build_generation_prompt(_question("http://127.0.0.1:9/a.png"))


def test_image_tokens_get_zero_weight(renderer: Qwen3VLRenderer) -> None:
    messages = [*_question(_png(320, 480)), {"role": "assistant", "content": "A gradient."}]
    model_input, weights = renderer.build_supervised_example(messages, TrainOnWhat.ALL_TOKENS)
    assert len(weights) == model_input.length
    start = model_input.chunks[0].length
    assert weights[start : start + 150].sum() == 0 and weights.sum() == model_input.length - 150


def test_image_without_processor_is_a_clear_error(qwen3_tokenizer: Tokenizer) -> None:
    bare = get_renderer("qwen3_vl", qwen3_tokenizer)
    bare.build_generation_prompt([{"role": "user", "content": "text only is fine"}])
    with pytest.raises(RendererError, match="needs an image processor to render images"):
        bare.build_generation_prompt(_question(_png(40, 40)))
    with pytest.raises(RendererError, match=r"role 'assistant'\) has an image part"):
        bare.build_generation_prompt([{"role": "assistant", "content": [{"type": "image", "image": b""}]}])


def test_resize_image() -> None:
    image = Image.new("RGB", (800, 400))
    assert resize_image(image, 200).size == (200, 100)
    assert resize_image(image, 1000) is image


def _expand(model_input: types.ModelInput, processor: object) -> dict[str, torch.Tensor]:
    """Model inputs for Qwen3-VL: each ImageChunk becomes expected_tokens ``<|image_pad|>`` ids plus pixels."""
    ids: list[int] = []
    pixels, grids = [], []
    for chunk in model_input.chunks:
        if isinstance(chunk, types.EncodedTextChunk):
            ids.extend(chunk.tokens)
        else:
            pixel_values, grid = image_chunk_pixels(chunk, processor)  # type: ignore[arg-type]
            assert int(grid.prod()) // 4 == chunk.expected_tokens
            ids.extend([IMAGE_PAD_ID] * chunk.length)
            pixels.append(pixel_values)
            grids.append(grid)
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": torch.cat(pixels),
        "image_grid_thw": torch.cat(grids),
        "mm_token_type_ids": (input_ids == IMAGE_PAD_ID).long(),
    }


def test_tiny_qwen3_vl_forward_pass_on_rendered_input(renderer: Qwen3VLRenderer) -> None:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": 151936,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "deepstack_visual_indexes": [0, 1],
        },
        image_token_id=IMAGE_PAD_ID,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )
    model = Qwen3VLForConditionalGeneration(config).eval()
    messages = [*_question(_png(64, 96)), {"role": "assistant", "content": "Colours."}]
    model_input, weights = renderer.build_supervised_example(messages)
    inputs = _expand(model_input, renderer.image_processor)
    assert inputs["input_ids"].shape[1] == len(weights) == model_input.length
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, model_input.length, 151936)
    assert torch.isfinite(logits).all()


def test_openai_message_keeps_images(renderer: Qwen3VLRenderer) -> None:
    data = _png(8, 8)
    out = renderer.to_openai_message(
        {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image", "image": data}]}
    )
    assert out == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Look:"},
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()},
            },
        ],
    }
    url = "https://example.com/cat.png"
    out = renderer.to_openai_message({"role": "user", "content": [{"type": "image", "image": url}]})
    assert out["content"] == [{"type": "image_url", "image_url": {"url": url}}]
