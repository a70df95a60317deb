"""The official SDK's module path ``tinker.types.sampling_params``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import SamplingParams

__all__ = ["SamplingParams"]
