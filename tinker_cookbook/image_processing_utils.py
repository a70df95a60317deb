"""Image processors and image helpers for vision-language models (Qwen3-VL).

``get_image_processor(model_name)`` returns the model's Hugging Face image processor: from the HF cache or Hub
when available, otherwise one built from Qwen3-VL's published preprocessing settings (patch 16, merge 2,
pixel range 256² to 4096², mean and std 0.5), which works offline with only Pillow. It is the PIL variant of
``Qwen2VLImageProcessor``; the "fast" variant would need torchvision.

``image_to_chunk(image, processor)`` turns an image into a ``types.ImageChunk`` whose ``expected_tokens`` is
the number of ``<|image_pad|>`` tokens the model sees for it: (grid_h * grid_w) / merge_size² after the
processor's resize.
"""

from __future__ import annotations

import base64
import functools
import io
import logging
import urllib.request
from pathlib import Path
from typing import Any, Literal, TypeAlias

from PIL import Image

from tinker_cookbook.base.image_processors import (  # noqa: F401 - re-exported
    QWEN3_VL_PROCESSOR_SETTINGS,
    build_qwen3_vl_image_processor,
)
from tinker_cookbook.exceptions import ConfigurationError, RendererError
from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import TINY_MODEL_PREFIX, hub_is_reachable, strip_model_suffix

logger = logging.getLogger(__name__)

ImageProcessor: TypeAlias = Any
"""A Hugging Face image processor (``BaseImageProcessor``); Qwen-VL ones have ``patch_size`` and ``merge_size``."""

ImageSource: TypeAlias = "str | bytes | Image.Image"
ImageFormat: TypeAlias = Literal["png", "jpeg"]


_URL_TIMEOUT_S = 30


def _is_qwen3_vl(model_name: str) -> bool:
    return model_name.startswith("Qwen/Qwen3-VL-") or model_name in (f"{TINY_MODEL_PREFIX}qwen3-vl",
                                                                     f"{TINY_MODEL_PREFIX}qwen3-vl-moe")


@functools.cache
def get_image_processor(model_name: str) -> ImageProcessor:
    """The image processor of a vision-language model (cached per name); ``ConfigurationError`` for others."""
    name = strip_model_suffix(model_name)
    if not _is_qwen3_vl(name):
        raise ConfigurationError(
            f"model {model_name!r} has no known image processor; vision input is supported for Qwen/Qwen3-VL-* "
            f"models and {TINY_MODEL_PREFIX}qwen3-vl(-moe)"
        )
    if not name.startswith(TINY_MODEL_PREFIX):
        processor = _from_huggingface(name)
        if processor is not None:
            return processor
    return build_qwen3_vl_image_processor()


def _from_huggingface(name: str) -> ImageProcessor | None:
    from huggingface_hub import try_to_load_from_cache

    # Importing AutoImageProcessor alone takes seconds, so look in the cache (and at the network) first.
    cached = isinstance(try_to_load_from_cache(name, "preprocessor_config.json"), str)
    attempts = ([{"local_files_only": True}] if cached else []) + ([{}] if hub_is_reachable() else [])
    if not attempts:
        return None
    from transformers import AutoImageProcessor

    for kwargs in attempts:
        try:
            return AutoImageProcessor.from_pretrained(name, **kwargs)
        except (OSError, ValueError, ImportError) as e:
            logger.debug("image processor for %s not loaded with %s: %s", name, kwargs, e)
    return None


# ---------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------


def load_image_bytes(image: ImageSource) -> tuple[bytes, ImageFormat]:
    """Encoded bytes and format (``"png"`` / ``"jpeg"``) of an image given as a PIL image, bytes, a path,
    an http(s) URL or a ``data:`` URI. PNG and JPEG bytes are kept as they are; anything else becomes PNG."""
    if isinstance(image, Image.Image):
        return _encode_png(image), "png"
    if isinstance(image, (bytes, bytearray)):
        data = bytes(image)
    elif isinstance(image, str) and image.startswith("data:"):
        data = base64.b64decode(image.split(",", 1)[1])
    elif isinstance(image, str) and image.startswith(("http://", "https://")):
        data = _fetch(image)
    elif isinstance(image, (str, Path)) and _is_file(image):
        data = Path(image).read_bytes()
    else:
        raise RendererError(
            f"ImagePart.image must be a PIL image, PNG/JPEG bytes, a file path, an http(s) URL or a data: URI; "
            f"got {type(image).__name__} {str(image)[:80]!r}"
        )
    kind = _sniff_format(data)
    if kind is None:
        return _encode_png(Image.open(io.BytesIO(data))), "png"
    return data, kind


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=_URL_TIMEOUT_S) as response:
            return response.read()
    except OSError as e:  # URLError and timeouts are OSErrors
        raise RendererError(
            f"could not download image {url!r}: {e}; pass the image as bytes, a file path or a PIL image instead"
        ) from e


def _is_file(path: str | Path) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # e.g. a name too long to be a path, or one with a NUL byte
        return False


def _sniff_format(data: bytes) -> ImageFormat | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    return None


def _encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def decode_image(data: bytes) -> Image.Image:
    """An RGB PIL image from encoded bytes."""
    return Image.open(io.BytesIO(data)).convert("RGB")


def num_image_tokens(image_processor: ImageProcessor, height: int, width: int) -> int:
    """How many ``<|image_pad|>`` tokens a ``height`` x ``width`` image becomes after the processor's resize."""
    patches = image_processor.get_number_of_image_patches(height, width, {})
    return int(patches) // int(image_processor.merge_size) ** 2


def image_to_chunk(image: ImageSource, image_processor: ImageProcessor) -> types.ImageChunk:
    """An ``ImageChunk`` holding the encoded image, with ``expected_tokens`` from ``image_processor``."""
    data, kind = load_image_bytes(image)
    width, height = decode_image(data).size
    return types.ImageChunk(
        data=data, format=kind, expected_tokens=num_image_tokens(image_processor, height, width)
    )


def image_chunk_pixels(chunk: types.ImageChunk, image_processor: ImageProcessor) -> tuple[Any, Any]:
    """``(pixel_values, image_grid_thw)`` tensors of an ``ImageChunk`` for a Qwen-VL model's forward pass."""
    out = image_processor(images=[decode_image(chunk.data)], return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def resize_image(image: Image.Image, max_size: int) -> Image.Image:
    """``image`` scaled down (aspect kept) so that its longer side is at most ``max_size`` pixels."""
    if max_size <= 0:
        raise ValueError(f"max_size must be positive, got {max_size}")
    longer = max(image.size)
    if longer <= max_size:
        return image
    scale = max_size / longer
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))


def image_to_data_uri(image: ImageSource) -> str:
    """A ``data:image/...;base64,...`` URI of the image (e.g. for OpenAI-style messages)."""
    data, kind = load_image_bytes(image)
    return f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"
