"""Image inputs for Qwen3-VL models (dense and mixture-of-experts), in training and sampling.

A model input's ``ImageChunk`` (or ``ImageAssetPointerChunk`` naming a local file or a ``data:`` URL) becomes
``expected_tokens`` copies of the model's image placeholder token plus the image's pixel patches. From there the
model's own code does the rest, so that training, sampling and the transformers forward agree:

- pixels: the model's image processor (from the HF cache for hub models; Qwen3-VL's published settings, shared
  with the renderers through ``tinker_cookbook.base.image_processors``, for the tiny test model);
- positions: Qwen3-VL's multimodal rotary positions come from the model's ``get_rope_index``; the sampler's
  compact decoder takes the cos/sin of those positions from the model's own text rotary embedding;
- features: the model's vision tower gives each image's merged features (scattered over its placeholder tokens)
  and the DeepStack features added to the hidden states after the first decoder layers.

Training runs the whole HF model (``language_hidden``). Every sampler checks a prompt's images and computes its
positions with ``PromptImages``. The fast path's compact decoder (dense Qwen3-VL) adds ``SamplerVision``: the HF
vision tower, sharing the frozen base weights, feeding its features into the decoder through ``PackedVision``. The
general path (Qwen3-VL-MoE) runs the whole HF model, vision tower included, on the prompt's pixels and positions.
"""

from __future__ import annotations

import base64
import binascii
import collections
import functools
import hashlib
import io
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tinker_cookbook.engine import base_cache
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, UnprocessableEntityError

_VISUAL_PREFIX = "model.visual."
_IMAGE_CACHE_BYTES = 64 * 2**20
"""Pixel values of recently prepared images kept per model (RL groups and epochs send the same image many times);
a 256x256 image takes 1.5 MiB."""


def is_vision_config(config: Any) -> bool:
    """Whether ``config`` is of a Qwen3-VL model, dense or MoE (the only vision family the engine runs)."""
    return hasattr(config, "vision_config") and getattr(config, "image_token_id", None) is not None


# ---------------------------------------------------------------------------------------------------------
# Images -> pixel patches


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """One image as the vision tower takes it."""

    pixel_values: torch.Tensor
    """``[patches, channels * temporal_patch * patch * patch]`` from the image processor."""
    grid_thw: torch.Tensor
    """``[3]`` int64: the patch grid (time, height, width)."""
    num_tokens: int
    """Placeholder tokens in the language model: ``t * h * w / merge_size**2``."""
    digest: str
    """sha256 of the pixel values, so that prompts with the same tokens but other images never share a prefill."""


class ImageInputs:
    """Turns the image chunks of a model input into placeholder tokens and prepared images, for one model."""

    def __init__(self, model_name: str, config: Any, processor: Any) -> None:
        self.model_name = model_name
        self.image_token_id = int(config.image_token_id)
        self.processor = processor
        self.merge_size = int(config.vision_config.spatial_merge_size)
        self._cache: collections.OrderedDict[bytes, PreparedImage] = collections.OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()

    def expand(self, model_input: types.ModelInput, where: str) -> tuple[list[int], tuple[PreparedImage, ...]]:
        """The token ids (each image as its placeholder tokens) and the images in order of appearance."""
        tokens: list[int] = []
        images: list[PreparedImage] = []
        for index, chunk in enumerate(model_input.chunks):
            at = f"{where}.chunks[{index}]"
            if isinstance(chunk, types.EncodedTextChunk):
                text = [int(t) for t in chunk.tokens]
                if self.image_token_id in text:
                    raise BadRequestError(
                        f"{at} (an EncodedTextChunk) holds the image placeholder token id {self.image_token_id}; "
                        "give each image as an ImageChunk (between <|vision_start|> and <|vision_end|>), never its "
                        "placeholder tokens as text"
                    )
                tokens += text
                continue
            image = self.prepare(chunk, at)
            images.append(image)
            tokens += [self.image_token_id] * image.num_tokens
        return tokens, tuple(images)

    def prepare(self, chunk: types.ImageChunk | types.ImageAssetPointerChunk, where: str) -> PreparedImage:
        data = _chunk_bytes(chunk, where)
        key = hashlib.sha256(data).digest()
        with self._lock:
            image = self._cache.get(key)
            if image is not None:
                self._cache.move_to_end(key)
        if image is None:
            image = self._preprocess(data, where)
            self._remember(key, image)
        expected = chunk.expected_tokens
        if expected is not None and expected != image.num_tokens:
            raise BadRequestError(
                f"{where}.expected_tokens={expected!r}, but {self.model_name}'s image processor makes "
                f"{image.num_tokens} tokens of this image; set expected_tokens={image.num_tokens} (or None), e.g. by "
                "rendering the image with this model's renderer and image processor"
            )
        return image

    def _remember(self, key: bytes, image: PreparedImage) -> None:
        size = image.pixel_values.numel() * image.pixel_values.element_size()
        with self._lock:
            if key in self._cache or size > _IMAGE_CACHE_BYTES:
                return
            self._cache[key] = image
            self._cache_bytes += size
            while self._cache_bytes > _IMAGE_CACHE_BYTES:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.pixel_values.numel() * old.pixel_values.element_size()

    def _preprocess(self, data: bytes, where: str) -> PreparedImage:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as opened:
                picture = opened.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise BadRequestError(
                f"{where} is not a readable image ({type(exc).__name__}: {exc}); pass the bytes of a PNG or JPEG "
                "file"
            ) from exc
        out = self.processor(images=[picture], return_tensors="pt")
        pixels = out["pixel_values"].float().contiguous()
        grid = out["image_grid_thw"].reshape(-1, 3)[0].to(torch.int64)
        return PreparedImage(
            pixel_values=pixels,
            grid_thw=grid,
            num_tokens=int(grid.prod()) // self.merge_size**2,
            digest=hashlib.sha256(pixels.numpy().tobytes()).hexdigest(),
        )


def _chunk_bytes(chunk: Any, where: str) -> bytes:
    """The encoded image of an ImageChunk, or of the local file / data URL an ImageAssetPointerChunk names."""
    if isinstance(chunk, types.ImageChunk):
        return bytes(chunk.data)
    if not isinstance(chunk, types.ImageAssetPointerChunk):
        raise BadRequestError(f"{where} is a {type(chunk).__name__}, not a text or image chunk")
    location = chunk.location
    if location.startswith("data:"):
        header, _, payload = location.partition(",")
        try:
            if header.endswith(";base64"):
                return base64.b64decode(payload, validate=True)
            return urllib.parse.unquote_to_bytes(payload)
        except (binascii.Error, ValueError) as exc:
            raise BadRequestError(f"{where}.location is a data: URL whose payload is not valid base64 ({exc}); "
                                  "encode the image as data:image/png;base64,<base64 of the file>") from exc
    path = Path(urllib.parse.unquote(location.removeprefix("file://")) if location.startswith("file://") else location)
    if "://" in location and not location.startswith("file://"):
        raise BadRequestError(
            f"{where}.location={location[:100]!r} is a remote URL, which the local engine does not fetch; download "
            "the image and send its bytes in an ImageChunk, or point at a local file or a data: URL"
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BadRequestError(f"{where}.location={location[:100]!r} cannot be read ({exc.strerror or exc}); give the "
                              "path of an existing local image file, or a data: URL") from exc


@functools.cache
def _processor_for(model_name: str, source: str) -> Any:
    """The image processor of ``model_name``: its own from the HF cache (or hub), else Qwen3-VL's settings."""
    from tinker_cookbook.base.image_processors import build_qwen3_vl_image_processor

    if source == "hf":
        from transformers import AutoImageProcessor

        from tinker_cookbook.base.hub import hf_cache_dir, hub_is_reachable

        try:
            return AutoImageProcessor.from_pretrained(
                model_name, cache_dir=hf_cache_dir(), local_files_only=not hub_is_reachable()
            )
        except (OSError, ValueError, ImportError):
            pass  # no preprocessor_config.json here: Qwen3-VL models all share the published settings
    return build_qwen3_vl_image_processor()


def image_inputs_for(model_name: str, source: str, config: Any) -> ImageInputs | None:
    """The image handling of a model; None for text-only models."""
    if not is_vision_config(config):
        return None
    return ImageInputs(model_name, config, _processor_for(model_name, source))


def expand_model_input(
    model_input: types.ModelInput, where: str, images: ImageInputs | None, model: str
) -> tuple[list[int], tuple[PreparedImage, ...]]:
    """Token ids and prepared images of ``model_input``; image chunks for a text-only model are refused."""
    if images is not None:
        return images.expand(model_input, where)
    for index, chunk in enumerate(model_input.chunks):
        if not isinstance(chunk, types.EncodedTextChunk):
            raise UnprocessableEntityError(
                f"{where}.chunks[{index}] is an {type(chunk).__name__}, but {model} is a text-only model; remove "
                "the image chunks, or use a vision-language model (Qwen/Qwen3-VL-*, or tinker-cookbook/tiny-qwen3-vl "
                "for tests)"
            )
    return model_input.to_ints(), ()


# ---------------------------------------------------------------------------------------------------------
# Training: the whole HF model


def image_batch(images: Sequence[PreparedImage]) -> tuple[torch.Tensor, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of several images, as the HF model takes them."""
    return torch.cat([im.pixel_values for im in images]), torch.stack([im.grid_thw for im in images])


def language_hidden(model: Any, ids: torch.Tensor, images: Sequence[PreparedImage]) -> torch.Tensor:
    """Final hidden states ``[batch, len, H]`` of a Qwen3-VL model on right-padded ``ids`` with ``images``.

    ``images`` are in reading order over the rows (row 0's first, ...), as the placeholders appear in ``ids``.
    Position ids come from the model's own ``get_rope_index`` and are passed explicitly, so that the model's
    cached ``rope_deltas`` (generation state) is neither used nor changed.
    """
    inner = model.model
    pixel_values, grid = image_batch(images)
    pixel_values, grid = pixel_values.to(ids.device), grid.to(ids.device)  # the images are prepared on the CPU
    mm_types = (ids == inner.config.image_token_id).to(torch.int32)
    positions, _ = inner.get_rope_index(ids, mm_token_type_ids=mm_types, image_grid_thw=grid)
    out = inner(input_ids=ids, pixel_values=pixel_values, image_grid_thw=grid, position_ids=positions,
                use_cache=False)
    return out.last_hidden_state


# ---------------------------------------------------------------------------------------------------------
# Sampling: the HF vision tower feeding the compact decoder


@dataclass(frozen=True, eq=False)
class PromptVision:
    """A prompt's images with its multimodal positions, computed when the request is validated."""

    images: tuple[PreparedImage, ...]
    position_ids: torch.Tensor
    """``[3, len]`` (time, height, width) rotary positions of every prompt token."""
    rope_delta: int
    """Generated token ``i`` (0-based cache position ``p``) sits at rotary position ``p + rope_delta``."""

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(image.digest for image in self.images)


def _model_class(config: Any) -> Any:
    """The HF multimodal model class (without head) of a Qwen3-VL config, dense or MoE."""
    if config.model_type == "qwen3_vl_moe":
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeModel

        return Qwen3VLMoeModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    return Qwen3VLModel


class _RopeIndex:
    """The model's own ``get_rope_index`` without a model instance: it reads only ``config`` and
    ``get_vision_position_ids``, so the sampler can use the model's function on its config alone."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self._model_class: Any = _model_class(config)  # its methods, called with this object as self

    def __call__(self, ids: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mm_types = (ids == self.config.image_token_id).to(torch.int32)
        return self._model_class.get_rope_index(self, ids, mm_token_type_ids=mm_types, image_grid_thw=grid)

    def get_vision_position_ids(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._model_class.get_vision_position_ids(self, *args, **kwargs)


@dataclass
class PackedVision:
    """The image parts of one packed prefill (several prompts' tokens concatenated)."""

    rows: torch.Tensor
    """Packed token rows that hold image placeholders, in order."""
    embeds: torch.Tensor
    """``[len(rows), H]`` merged image features replacing those rows' token embeddings."""
    deepstack: list[torch.Tensor]
    """Per early decoder layer: ``[len(rows), H]`` added to the hidden states of those rows after that layer."""
    rope_rows: torch.Tensor
    """Packed rows of prompts with images, whose cos/sin come from their multimodal positions."""
    cos: torch.Tensor
    sin_signed: torch.Tensor

    def inputs(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The embeddings and cos/sin tables of the packed prompts with the image parts put in (new tensors)."""
        h, cos, sin = h.clone(), cos.clone(), sin.clone()
        h[self.rows] = self.embeds
        cos[self.rope_rows] = self.cos
        sin[self.rope_rows] = self.sin_signed
        return h, cos, sin

    def after_layer(self, index: int, h: torch.Tensor) -> torch.Tensor:
        """DeepStack: the vision tower's intermediate features added after the first decoder layers."""
        if index < len(self.deepstack):
            h[self.rows] += self.deepstack[index]
        return h


class PromptImages:
    """What every sampler needs for images on one base model: preprocessing and the prompt's positions."""

    def __init__(self, config: Any, image_inputs: ImageInputs) -> None:
        self.image_inputs = image_inputs
        self.image_token_id = image_inputs.image_token_id
        self.rope_index = _RopeIndex(config)

    def prompt(self, model_input: types.ModelInput, where: str) -> tuple[list[int], PromptVision | None]:
        """Validate a prompt: its token ids, and its images with their positions (None without images)."""
        tokens, images = self.image_inputs.expand(model_input, where)
        if not images:
            return tokens, None
        ids = torch.tensor([tokens], dtype=torch.int64)
        positions, deltas = self.rope_index(ids, torch.stack([im.grid_thw for im in images]))
        return tokens, PromptVision(images=images, position_ids=positions[:, 0], rope_delta=int(deltas.reshape(-1)[0]))

    def hide_placeholders(self, tokens: Sequence[int], scored: list[float | None],
                          topk: list[list[tuple[int, float]] | None] | None) -> None:
        """Blank the prompt logprobs (and top-k) at image placeholders, in place: they have no meaningful one."""
        for position in (i for i, t in enumerate(tokens) if t == self.image_token_id):
            scored[position] = None
            if topk is not None:
                topk[position] = None


class SamplerVision(PromptImages):
    """The fast path's image handling: ``PromptImages`` plus the vision tower feeding the compact decoder."""

    def __init__(self, config: Any, base_state: Mapping[str, torch.Tensor], image_inputs: ImageInputs) -> None:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

        super().__init__(config, image_inputs)
        self.tower = _vision_tower(config, base_state)
        self.rotary = Qwen3VLTextRotaryEmbedding(config.get_text_config())

    @torch.inference_mode()
    def pack(self, prompts: Sequence[tuple[Sequence[int], PromptVision | None]]) -> PackedVision | None:
        """The image parts of prompts packed one after another; None when none has images."""
        images = [im for _, vision in prompts if vision is not None for im in vision.images]
        if not images:
            return None
        pixel_values, grid = image_batch(images)
        out = self.tower(pixel_values, grid_thw=grid, return_dict=True)
        rows, rope_rows, cos, sin = [], [], [], []
        start = 0
        for tokens, vision in prompts:
            if vision is not None:
                ids = torch.tensor(tokens)
                rows.append(start + (ids == self.image_token_id).nonzero()[:, 0])
                rope_rows.append(torch.arange(start, start + len(tokens)))
                # The model's rotary embedding on its 3-D positions; x only gives dtype and device (fp32, CPU).
                c, s = self.rotary(out.pooler_output.new_zeros(1), vision.position_ids[:, None, :])
                cos.append(c[0].float())
                sin.append(_signed_sin(s[0].float()))
            start += len(tokens)
        return PackedVision(
            rows=torch.cat(rows),
            embeds=out.pooler_output.float(),
            deepstack=[feature.float() for feature in out.deepstack_features],
            rope_rows=torch.cat(rope_rows),
            cos=torch.cat(cos),
            sin_signed=torch.cat(sin),
        )


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """The decoder's rotation uses roll(x, half) for rotate_half(x) = cat(-x2, x1): fold that sign into sin."""
    half = sin.shape[-1] // 2
    signed = sin.clone()
    signed[:, :half] *= -1
    return signed


def _vision_tower(config: Any, base_state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """The model's vision tower holding the base weights themselves (no copy), in eval mode, frozen.

    Built on the meta device, so nothing is initialised; the weights are then assigned and the non-persistent
    buffers (the rotary frequencies) rebuilt on the weights' device.
    """
    from transformers.models.qwen3_vl.modeling_qwen3_vl import (
        Qwen3VLVisionModel,
        Qwen3VLVisionRotaryEmbedding,
    )

    state = {k.removeprefix(_VISUAL_PREFIX): v for k, v in base_state.items() if k.startswith(_VISUAL_PREFIX)}
    if not state:
        raise BadRequestError(f"base_state has no '{_VISUAL_PREFIX}*' tensors; pass the full HF state dict of the "
                              "Qwen3-VL base model")
    device = next(iter(state.values())).device
    with torch.device("meta"):
        tower = Qwen3VLVisionModel._from_config(config.vision_config)
    tower.load_state_dict(state, strict=True, assign=True)
    with torch.device(device):
        tower.rotary_pos_emb = Qwen3VLVisionRotaryEmbedding(config.vision_config)
    left = [name for name, t in [*tower.named_parameters(), *tower.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"vision tower tensors left uninitialised: {left[:4]}")
    tower.eval()
    tower.requires_grad_(False)
    return tower


def _sampler_image_inputs(config: Any) -> ImageInputs:
    """The image preprocessing of the model ``config`` describes (its own processor for a hub model)."""
    from tinker_cookbook.base.tiny_models import TINY_MODEL_CONFIGS

    name = str(getattr(config, "name_or_path", "") or "")
    source = "hf" if name and name not in TINY_MODEL_CONFIGS else "tiny"
    return ImageInputs(name or "this model", config, _processor_for(name, source))


def sampler_vision(config: Any, base_state: Mapping[str, torch.Tensor]) -> SamplerVision | None:
    """The fast path's image handling for a base model; None for text-only models (and Qwen3-VL's text part)."""
    if not is_vision_config(config):
        return None
    # One tower per base model, shared by every snapshot of it (LoRA adapts the language model only).
    return base_cache.shared("vision", base_state,
                             lambda: SamplerVision(config, base_state, _sampler_image_inputs(config)))


def prompt_images(config: Any, base_state: Mapping[str, torch.Tensor]) -> PromptImages | None:
    """The general path's image handling for a base model (its snapshots run the vision tower themselves); None for
    text-only models."""
    if not is_vision_config(config):
        return None
    return base_cache.shared("prompt_images", base_state, lambda: PromptImages(config, _sampler_image_inputs(config)))
