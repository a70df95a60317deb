"""tinker_cookbook: a local Tinker-compatible API, LoRA engine and cookbook.

``from tinker_cookbook import tinker`` gives the API; the cookbook packages (renderers, supervised, rl, ...) are
built on it.
"""

from tinker_cookbook.exceptions import (
    AllTrajectoriesFailedError,
    CheckpointError,
    ConfigurationError,
    DataError,
    DataFormatError,
    DataValidationError,
    EvalError,
    RendererError,
    TinkerCookbookError,
    TrainingError,
    WeightsError,
)

__version__ = "0.1.0"

__all__ = [
    "AllTrajectoriesFailedError", "CheckpointError", "ConfigurationError", "DataError", "DataFormatError",
    "DataValidationError", "EvalError", "RendererError", "TinkerCookbookError", "TrainingError", "WeightsError",
    "__version__",
]
