"""Learning-rate schedules: a multiplier of the base learning rate as a function of the step.

All schedules start at 1.0 at step 0 and are defined over ``total_steps`` steps (the planned length of the run):

- ``constant``: 1
- ``linear``:   1 - step / total_steps                       (reaches 0 one step past the end)
- ``cosine``:   0.5 * (1 + cos(pi * step / total_steps))

Warm-up is optional and applies to every schedule: during the first ``warmup_steps`` steps the multiplier is
scaled by ``(step + 1) / warmup_steps``, so that the very first step does not use a learning rate of 0.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias, get_args

LRSchedule: TypeAlias = Literal["linear", "cosine", "constant"]
LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)


def compute_schedule_lr_multiplier(
    lr_schedule: LRSchedule, step: int, total_steps: int, warmup_steps: int = 0
) -> float:
    """The factor to multiply the base learning rate by at ``step`` (0-based) of a ``total_steps``-step run."""
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule={lr_schedule!r} is not a known schedule; use one of {list(LR_SCHEDULES)}")
    if total_steps <= 0:
        raise ValueError(f"total_steps={total_steps} must be positive")
    if step < 0:
        raise ValueError(f"step={step} must be non-negative")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be non-negative")
    fraction = min(step / total_steps, 1.0)
    if lr_schedule == "linear":
        multiplier = 1.0 - fraction
    elif lr_schedule == "cosine":
        multiplier = 0.5 * (1.0 + math.cos(math.pi * fraction))
    else:
        multiplier = 1.0
    if step < warmup_steps:
        multiplier *= (step + 1) / warmup_steps
    return multiplier
