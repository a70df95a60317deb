"""The official SDK's module path ``tinker.types.checkpoint``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import Checkpoint, CheckpointType, ParsedCheckpointTinkerPath

__all__ = ["Checkpoint", "CheckpointType", "ParsedCheckpointTinkerPath"]
