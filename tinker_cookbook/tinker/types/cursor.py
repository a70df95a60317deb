"""The official SDK's module path ``tinker.types.cursor``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import Cursor

__all__ = ["Cursor"]
