"""The official SDK's module path ``tinker.types.weights_info_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import WeightsInfoResponse

__all__ = ["WeightsInfoResponse"]
