"""The official SDK's module path ``tinker.types.model_input``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import ModelInput

__all__ = ["ModelInput"]
