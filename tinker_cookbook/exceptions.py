"""The cookbook's exception hierarchy.

Every message names the field or argument, the bad value, and how to fix it. Errors raised through the
Tinker-compatible API (``tinker_cookbook.tinker``) are ``tinker.TinkerError`` subclasses instead; see
``tinker_cookbook/tinker/errors.py``.
"""

from __future__ import annotations


class TinkerCookbookError(Exception):
    """Base class of all cookbook errors."""


class ConfigurationError(TinkerCookbookError, ValueError):
    """A config field or argument has a bad value, or a needed resource is not available."""


class DataError(TinkerCookbookError, ValueError):
    """Input data is malformed (bad JSONL line, conversation without trainable tokens, ...)."""


class DataFormatError(DataError):
    """Input data does not have the expected structure."""


class DataValidationError(DataError):
    """Input data has the right structure but invalid values."""


class RendererError(TinkerCookbookError, ValueError):
    """A conversation cannot be rendered or parsed by the chosen renderer."""


class TrainingError(TinkerCookbookError, RuntimeError):
    """A training loop cannot continue."""


class CheckpointError(TinkerCookbookError, RuntimeError):
    """A checkpoint cannot be saved, found, or resumed from."""


class WeightsError(TinkerCookbookError, RuntimeError):
    """Trained weights cannot be merged, converted, exported or published (see ``tinker_cookbook.weights``)."""


class AllTrajectoriesFailedError(TrainingError):
    """Every rollout of an RL batch failed, so there is nothing to train on."""


class EvalError(TinkerCookbookError, RuntimeError):
    """An evaluator failed."""
