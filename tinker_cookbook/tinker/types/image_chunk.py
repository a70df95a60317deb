"""The official SDK's module path ``tinker.types.image_chunk``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ImageChunk

__all__ = ["ImageChunk"]
