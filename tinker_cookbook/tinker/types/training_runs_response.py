"""The official SDK's module path ``tinker.types.training_runs_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import TrainingRunsResponse

__all__ = ["TrainingRunsResponse"]
