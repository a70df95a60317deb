import math

import pytest

from tinker_cookbook.utils.lr_scheduling import compute_schedule_lr_multiplier


def test_linear_decays_from_one_by_one_over_total_per_step():
    # total 4 -> 1, 0.75, 0.5, 0.25
    assert [compute_schedule_lr_multiplier("linear", s, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_cosine_hand_values():
    # 0.5 * (1 + cos(pi * s / 4)): s=0 -> 1, s=1 -> 0.5 * (1 + sqrt(2)/2) = 0.853553..., s=2 -> 0.5
    assert compute_schedule_lr_multiplier("cosine", 0, 4) == 1.0
    assert compute_schedule_lr_multiplier("cosine", 1, 4) == pytest.approx(0.8535533905932737)
    assert compute_schedule_lr_multiplier("cosine", 2, 4) == pytest.approx(0.5)
    assert compute_schedule_lr_multiplier("cosine", 4, 4) == pytest.approx(0.0, abs=1e-12)


def test_constant_and_warmup():
    assert compute_schedule_lr_multiplier("constant", 99, 10) == 1.0
    # warm-up of 4 steps on a constant schedule: 1/4, 2/4, 3/4, 4/4, then 1
    assert [compute_schedule_lr_multiplier("constant", s, 10, warmup_steps=4) for s in range(5)] == [
        0.25, 0.5, 0.75, 1.0, 1.0,
    ]
    # warm-up multiplies the schedule: linear at step 1 of 10 is 0.9, times 2/4
    assert math.isclose(compute_schedule_lr_multiplier("linear", 1, 10, warmup_steps=4), 0.45)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="lr_schedule='exp'"):
        compute_schedule_lr_multiplier("exp", 0, 10)  # type: ignore[arg-type]  # the bad value is the point
    with pytest.raises(ValueError, match="total_steps=0"):
        compute_schedule_lr_multiplier("linear", 0, 0)
