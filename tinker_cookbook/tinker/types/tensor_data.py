"""The official SDK's module path ``tinker.types.tensor_data``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import TensorData

__all__ = ["TensorData"]
