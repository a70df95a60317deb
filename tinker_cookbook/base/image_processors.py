"""Qwen3-VL's image preprocessing settings, shared by the renderers (token counts) and the engine (pixels).

Both sides must turn an image into the same patch grid, or the renderer's ``expected_tokens`` would not match the
features the vision tower produces; so the settings live here, in the bottom layer both may import.
"""

from __future__ import annotations

from typing import Any

QWEN3_VL_PROCESSOR_SETTINGS: dict[str, Any] = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 256 * 256, "longest_edge": 4096 * 4096},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
"""Qwen3-VL's published preprocessing: patch 16, merge 2, pixel range 256² to 4096², mean and std 0.5."""


def build_qwen3_vl_image_processor() -> Any:
    """Qwen3-VL's image processor built from its settings, without files or torchvision (the PIL variant of
    ``Qwen2VLImageProcessor``; the "fast" one would need torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**QWEN3_VL_PROCESSOR_SETTINGS)
