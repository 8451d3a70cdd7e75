"""Learning-rate schedules: constant, and lr-scheduling's length-decay (Algorithm 1).

Algorithm 1 keeps η₀, and from the step the response-length surge is seen it halves the LR at
every multiple of ``T_decay`` down to the floor η∞ (default 10 % of η₀); ``T_decay`` is 1.8 × the
step of the surge (lr-scheduling §3.3 and §4.2).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: T_decay / surge step (lr-scheduling §4.2: 160 / 90 and 204 / 110 ≈ 1.8)
DECAY_PERIOD_FACTOR = 1.8
#: η∞ / η₀ (lr-scheduling §3.3, "defaulting to 10% of η₀"); also the ``lr-low`` remedy's factor
FLOOR_FRACTION = 0.1
#: a surge: the mean response length reaches this multiple of its early baseline ("triple")
SURGE_FACTOR = 3.0


def length_decay_lr(step: int, lr0: float, lr_min: float, decay_period: int | None) -> float:
    """Algorithm 1: ``η_t = max(η₀ / 2^⌊t / T_decay⌋, η∞)``; η₀ until a period is set."""
    if decay_period is None:
        return lr0
    return max(lr0 / 2 ** (step // decay_period), lr_min)


def surge_step(
    lengths: Sequence[float], factor: float = SURGE_FACTOR, baseline_steps: int = 5
) -> int | None:
    """First step whose mean response length is ``factor`` × the median of the first steps."""
    if len(lengths) <= baseline_steps:
        return None
    base = statistics.median(lengths[:baseline_steps])
    for step in range(baseline_steps, len(lengths)):
        if lengths[step] >= factor * base:
            return step
    return None


@dataclass
class LengthDecaySchedule:
    """Algorithm 1 with its trigger: watches the response lengths, sets T_decay at the surge."""

    lr0: float
    floor_fraction: float = FLOOR_FRACTION
    surge_factor: float = SURGE_FACTOR
    decay_period: int | None = None

    def lr(self, step: int, lengths: Sequence[float]) -> float:
        """The LR for ``step``, given the mean response length of every step before it."""
        if self.decay_period is None:
            surge = surge_step(lengths, self.surge_factor)
            if surge is not None:
                self.decay_period = max(1, round(DECAY_PERIOD_FACTOR * surge))
        return length_decay_lr(step, self.lr0, self.floor_fraction * self.lr0, self.decay_period)
