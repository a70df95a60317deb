"""The official SDK's module path ``tinker.types.loss_fn_inputs``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import LossFnInputs

__all__ = ["LossFnInputs"]
