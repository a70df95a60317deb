"""The official SDK's module path ``tinker.types.encoded_text_chunk``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import EncodedTextChunk

__all__ = ["EncodedTextChunk"]
