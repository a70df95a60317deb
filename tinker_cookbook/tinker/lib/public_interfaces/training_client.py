"""The official SDK's module path ``tinker.lib.public_interfaces.training_client``."""

from tinker_cookbook.tinker.training_client import TrainingClient

__all__ = ["TrainingClient"]
