"""The official SDK's module path ``tinker.types.model_id``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ModelID

__all__ = ["ModelID"]
