"""The official SDK's module path ``tinker.types.forward_backward_output``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ForwardBackwardOutput

__all__ = ["ForwardBackwardOutput"]
