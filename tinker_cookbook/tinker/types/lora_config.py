"""The official SDK's module path ``tinker.types.lora_config``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import LoraConfig

__all__ = ["LoraConfig"]
