"""The official SDK's module path ``tinker.types.loss_fn_output``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import LossFnOutput

__all__ = ["LossFnOutput"]
