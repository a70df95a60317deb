"""Killing a training loop right after it logged a step, for the kill-and-resume tests of every loop.

The kill is a metrics sink placed after the real ones, so the row of that step is on disk when the process "dies":
either by raising ``Killed`` (the in-process stand-in) or by a real SIGKILL (tests that run the loop in a child).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tinker_cookbook.utils import ml_log


class Killed(Exception):
    """Stands for the process dying."""


class _DieAfterStep(ml_log.Logger):
    """Once row ``step`` is written, the process 'dies'."""

    def __init__(self, step: int, sigkill: bool) -> None:
        self.step, self.sigkill = step, sigkill

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if step == self.step:
            if self.sigkill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise Killed(f"killed after logging step {step}")


def die_after_step(step: int, sigkill: bool = False, skip_loops: int = 0) -> None:
    """Make a loop die right after logging ``step``: the one that sets up logging after ``skip_loops`` others have
    (0: the next one; a pipeline's stages each set up their own). Undo with the ``restore_logging`` fixture."""
    real = ml_log.setup_logging
    seen = [0]

    def setup(*args: Any, **kwargs: Any) -> ml_log.Logger:
        logger = real(*args, **kwargs)
        seen[0] += 1
        if seen[0] <= skip_loops:
            return logger
        ml_log.setup_logging = real  # once only: the resumed run logs normally
        return ml_log.MultiplexLogger([logger, _DieAfterStep(step, sigkill)])

    ml_log.setup_logging = setup


@pytest.fixture
def restore_logging() -> Iterator[None]:
    real = ml_log.setup_logging
    yield
    ml_log.setup_logging = real
