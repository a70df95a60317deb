"""The official SDK's module path ``tinker.types.create_model_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import CreateModelResponse

__all__ = ["CreateModelResponse"]
