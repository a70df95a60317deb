"""The official SDK's module path ``tinker.types.loss_fn_type``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import LossFnType

__all__ = ["LossFnType"]
