"""The official SDK's module path ``tinker.types.save_weights_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import SaveWeightsResponse

__all__ = ["SaveWeightsResponse"]
