"""The official SDK's module path ``tinker.types.sample_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import SampleResponse

__all__ = ["SampleResponse"]
