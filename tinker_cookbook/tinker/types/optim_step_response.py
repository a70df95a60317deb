"""The official SDK's module path ``tinker.types.optim_step_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import OptimStepResponse

__all__ = ["OptimStepResponse"]
