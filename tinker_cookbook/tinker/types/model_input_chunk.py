"""The official SDK's module path ``tinker.types.model_input_chunk``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ModelInputChunk

__all__ = ["ModelInputChunk"]
