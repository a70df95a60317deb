"""The official SDK's module path ``tinker.types.sampled_sequence``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import SampledSequence

__all__ = ["SampledSequence"]
