"""The official SDK's module path ``tinker.types.stop_reason``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import StopReason

__all__ = ["StopReason"]
