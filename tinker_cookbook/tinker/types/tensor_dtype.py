"""The official SDK's module path ``tinker.types.tensor_dtype``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import TensorDtype

__all__ = ["TensorDtype"]
