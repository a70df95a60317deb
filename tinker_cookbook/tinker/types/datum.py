"""The official SDK's module path ``tinker.types.datum``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import Datum

__all__ = ["Datum"]
