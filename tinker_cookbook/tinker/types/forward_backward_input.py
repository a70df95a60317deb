"""The official SDK's module path ``tinker.types.forward_backward_input``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ForwardBackwardInput

__all__ = ["ForwardBackwardInput"]
