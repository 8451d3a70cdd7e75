"""The detectors on constructed step records whose firing step follows from the rules."""

from __future__ import annotations

import math

import pytest

from conformance.rl.detectors import (
    CollapseRules,
    MismatchRules,
    Verdict,
    collapse,
    first_sustained,
    lead_steps,
    mismatch_alarm,
    mismatch_firings,
    rolling_median,
)


def _rows(n: int, **series):
    def value(name, default, i):
        s = series.get(name, default)
        return s(i) if callable(s) else s

    rows = []
    for i in range(n):
        rows.append(
            {
                "step": i,
                "reward": value("reward", 0.7, i),
                "entropy": value("entropy", 0.2, i),
                "grad_norm": value("grad_norm", 1.5, i),
                "response_length": value("length", 6.0, i),
                "rho_outside_frac": value("outside", 0.0, i),
                "mismatch": {"rho_std": value("std", 0.004, i), "pcc": value("pcc", 0.9999, i)},
            }
        )
    return rows


def test_rolling_median_and_sustained_flags():
    assert rolling_median([1, 5, 2, math.nan, 9], 3) == [1, 3, 2, 3.5, 5.5]
    assert first_sustained([True, False, True, True, True], 3) == 4
    assert first_sustained([True, True, False], 3) is None


def test_a_steady_run_raises_nothing():
    rows = _rows(60)
    assert not mismatch_alarm(rows).fired
    assert not collapse(rows).fired


def test_exact_zero_mismatch_never_alarms():
    rows = _rows(40, std=0.0, pcc=1.0)
    assert mismatch_alarm(rows) == Verdict(
        False, None, None, "std ρ, its growth, PCC and ρ extremes within bounds"
    )


@pytest.mark.parametrize("k", [10, 25])
def test_growth_fires_once_the_rolling_median_has_stayed_high(k):
    rules = MismatchRules()
    high = rules.growth_factor * 0.02 * 1.5
    rows = _rows(50, std=lambda i: 0.02 if i < k else high)
    # the window-3 median is high from step k + 1 (two of three high), confirmed `persist` later
    expected = k + (rules.window // 2 + 1) - 1 + rules.persist - 1
    growth = [f for f in mismatch_firings(rows, rules) if f.rule == "growth"]
    assert [f.step for f in growth] == [expected]


def test_growth_below_the_absolute_floor_is_noise():
    rows = _rows(50, std=lambda i: 1e-7 if i < 20 else 1e-5)  # 100× growth of fp32 rounding
    assert not mismatch_alarm(rows).fired


def test_level_pcc_and_extremes_rules():
    rules = MismatchRules()
    assert mismatch_alarm(_rows(20, std=2 * rules.level_max)).signal == "level"
    assert mismatch_alarm(_rows(20, pcc=rules.pcc_min - 0.01)).signal == "pcc"
    assert mismatch_alarm(_rows(20, outside=2 * rules.outside_max)).signal == "extremes"


@pytest.mark.parametrize("k", [15, 30])
def test_reward_drop_is_confirmed_after_window_and_persist(k):
    rules = CollapseRules()
    rows = _rows(60, reward=lambda i: 0.8 if i < k else 0.1)
    verdict = collapse(rows, rules)
    # the window-5 median drops at k + 2 (three of five low); confirmed `persist` − 1 later
    assert verdict.signal == "reward"
    assert verdict.step == k + rules.window // 2 + rules.persist - 1


def test_a_run_that_never_learned_cannot_collapse():
    rows = _rows(40, reward=lambda i: 0.05 if i % 2 else 0.0)
    assert not collapse(rows).fired


def test_grad_spike_entropy_and_length_rules():
    rules = CollapseRules()
    spike = _rows(30, grad_norm=lambda i: 50.0 if i in (20, 22) else 1.5)
    assert not collapse(spike).fired  # isolated spikes, as in healthy long-answer runs
    surge = _rows(30, grad_norm=lambda i: 50.0 if i >= 20 else 1.5)
    # window-5 median high from step 22 (three of five), confirmed `persist` − 1 later
    assert (collapse(surge).signal, collapse(surge).step) == (
        "grad_norm",
        20 + rules.window // 2 + rules.persist - 1,
    )
    hot = _rows(30, entropy=lambda i: 0.2 if i < 10 else 0.2 * rules.entropy_factor * 2)
    assert collapse(hot).signal == "entropy"
    long = _rows(30, length=lambda i: 6.0 if i < 10 else 6.0 * rules.length_factor * 2)
    assert collapse(long).signal == "length"


def test_lead_is_collapse_step_minus_alarm_step():
    alarm = Verdict(True, 12, "growth", "")
    crash = Verdict(True, 30, "reward", "")
    assert lead_steps(alarm, crash) == 18
    assert lead_steps(Verdict(False, None, None, ""), crash) is None


def test_profile_rule_fires_when_a_shipped_profile_is_violated_persistently():
    from conformance.profiles import load_profile

    profile = load_profile("bf16")
    rules = MismatchRules()
    limit = profile.thresholds["rho_std"]
    k = 12
    rows = _rows(30, std=lambda i: 0.01 if i < k else 0.5 * (limit + rules.level_max))
    quiet = [f for f in mismatch_firings(rows, rules, profile) if f.rule == "profile"]
    assert quiet == []  # between the alarm's own level and the profile's: only "level" fires
    rows = _rows(30, std=lambda i: 0.01 if i < k else 2 * limit)
    loud = [f for f in mismatch_firings(rows, rules, profile) if f.rule == "profile"]
    assert [f.step for f in loud] == [k + rules.persist - 1]
