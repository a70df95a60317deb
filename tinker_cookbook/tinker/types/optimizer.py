"""The official SDK's module path ``tinker.types.optimizer``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import AdamParams

__all__ = ["AdamParams"]
