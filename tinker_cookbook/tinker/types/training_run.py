"""The official SDK's module path ``tinker.types.training_run``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import TrainingRun

__all__ = ["TrainingRun"]
