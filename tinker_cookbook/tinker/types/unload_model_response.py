"""The official SDK's module path ``tinker.types.unload_model_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import UnloadModelResponse

__all__ = ["UnloadModelResponse"]
