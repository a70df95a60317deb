"""The official SDK's module path ``tinker.types.save_weights_for_sampler_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import SaveWeightsForSamplerResponse

__all__ = ["SaveWeightsForSamplerResponse"]
