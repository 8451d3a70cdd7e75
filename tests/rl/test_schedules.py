"""lr-scheduling Algorithm 1 and its response-length trigger."""

from __future__ import annotations

import pytest

from conformance.rl.schedules import LengthDecaySchedule, length_decay_lr, surge_step


def _algorithm1(lr0: float, lr_min: float, period: int, steps: int) -> list[float]:
    """Algorithm 1 as written: η ← max(η / 2, η∞) whenever t mod T_decay = 0."""
    lr, out = lr0, []
    for t in range(steps):
        if t > 0 and t % period == 0:
            lr = max(lr / 2, lr_min)
        out.append(lr)
    return out


@pytest.mark.parametrize("period", [1, 3, 7])
def test_closed_form_matches_the_algorithm(period):
    expected = _algorithm1(1.0, 0.1, period, 40)
    assert [length_decay_lr(t, 1.0, 0.1, period) for t in range(40)] == expected


def test_no_decay_before_a_period_is_set():
    assert length_decay_lr(1000, 0.5, 0.05, None) == 0.5


def test_surge_is_the_first_step_at_three_times_the_baseline():
    lengths = [4, 5, 4, 6, 5, 7, 9, 15, 16, 2]
    assert surge_step(lengths) == 7  # median of the first five is 5; 15 >= 3 × 5
    assert surge_step(lengths[:7]) is None


def test_schedule_sets_the_period_at_1_8_times_the_surge():
    schedule = LengthDecaySchedule(lr0=1.0)
    lengths = [5.0] * 10 + [20.0]
    assert schedule.lr(10, lengths[:10]) == 1.0
    schedule.lr(11, lengths)
    assert schedule.decay_period == round(1.8 * 10)
    assert schedule.lr(18, lengths) == 0.5
    assert schedule.lr(1000, lengths) == pytest.approx(0.1)
