"""The official SDK's module path ``tinker.types.image_asset_pointer_chunk``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ImageAssetPointerChunk

__all__ = ["ImageAssetPointerChunk"]
