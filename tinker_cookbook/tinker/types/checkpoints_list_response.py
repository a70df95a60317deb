"""The official SDK's module path ``tinker.types.checkpoints_list_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import CheckpointsListResponse

__all__ = ["CheckpointsListResponse"]
