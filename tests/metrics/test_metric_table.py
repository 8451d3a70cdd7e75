"""The metric table: one worst rule, two-sided bounds for signed metrics, report order."""

from __future__ import annotations

import math

import pytest
from support.doctests import run_doctests

from conformance import metric_table
from conformance.metric_table import METRICS, metric, worst, worst_metrics


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        ("abs_diff_max", [1e-6, 3e-6, 2e-6], 3e-6),
        ("pcc", [0.9999, 0.99, 0.999], 0.99),
        ("rho_min", [0.99, 0.95, 1.0], 0.95),
        ("rho_mean", [1.01, 0.97, 1.02], 0.97),
        ("k1", [1e-4, -3e-4, 2e-4], -3e-4),
        ("chi2_token", [-2e-3, 1e-3], -2e-3),
    ],
)
def test_worst_is_furthest_from_the_ideal(name, values, expected) -> None:
    assert worst(name, values) == expected
    assert worst_metrics([{name: v} for v in values]) == {name: expected}


def test_nan_is_worst_and_non_numbers_are_ignored() -> None:
    assert math.isnan(worst("rho_std", [1e-3, float("nan"), 5.0]))
    assert worst("rho_std", [None, "x", True]) is None
    assert worst_metrics([{"rho_std": None, "not_a_metric": 3.0}]) == {}


def test_signed_metrics_are_bounded_on_both_sides() -> None:
    for fact in METRICS:
        if fact.bound != "abs":
            continue
        threshold = fact.ideal + 0.01
        assert fact.violates(fact.ideal + 0.02, threshold)
        assert fact.violates(fact.ideal - 0.02, threshold)
        assert not fact.violates(fact.ideal - 0.005, threshold)
        assert fact.violates(math.nan, threshold)


def test_violations_read_as_the_bound() -> None:
    assert metric("abs_diff_max").relation(0.2, 0.1) == "0.2 > 0.1"
    assert metric("pcc").relation(0.9, 0.99) == "0.9 < 0.99"
    assert metric("rho_mean").relation(0.9, 1.015) == "|0.9 − 1| > 0.015"
    assert metric("k1").relation(-0.2, 0.01) == "|-0.2| > 0.01"


def test_unknown_metric_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="abs_diff_max"):
        metric("abs_dif_max")


def test_every_length_growing_metric_has_a_scaled_counterpart() -> None:
    names = {m.name for m in METRICS}
    grows = [m.name for m in METRICS if m.grows_with_length]
    assert grows
    for name in grows:
        stem = name.removesuffix("_abs_max").removesuffix("_abs_diff")
        assert any(n.startswith(stem) and "per_sqrt_len" in n for n in names), name


def test_docstring_examples_run() -> None:
    run_doctests(metric_table)


def test_a_metric_one_token_moves_exponentially_is_marked_exp_scale() -> None:
    """``exp_scale`` is what ``calibrate`` leaves unbounded where MoE routes flip; it must hold
    every metric that one flipped token (a sound bf16 MoE stack reaches ±18 nats) moves as
    e^{nats}. Doubling that token's log-ratio from 6 to 12 nats moves a linear metric 2×, a
    quadratic one 4×, an exponential one e^6 ≈ 400× (k3 = mean ρ − 1 − log ρ, unmarked, gave a
    sound MoE stack's weight-sync check 592 against a calibrated 75)."""
    import torch

    from conformance.metrics import mismatch_metrics

    torch.manual_seed(0)
    lp_infer = -torch.rand(1, 1000, dtype=torch.float64) * 5
    noise = torch.randn(1, 1000, dtype=torch.float64) * 0.02
    mask = torch.ones(1, 1000, dtype=torch.bool)

    def deviations(nats: float) -> dict[str, float]:
        log_r = noise.clone()
        log_r[0, 500] = nats
        # lp_train must stay a log-probability: the flipped token's side is the engine's
        train, infer = lp_infer + log_r.clamp(max=0), lp_infer - log_r.clamp(min=0)
        return {k: metric(k).deviation(v) for k, v in mismatch_metrics(train, infer, mask).items()}

    growth: dict[str, float] = {}
    for sign in (1.0, -1.0):
        small, large = deviations(6 * sign), deviations(12 * sign)
        for name, value in large.items():
            growth[name] = max(growth.get(name, 0.0), value / max(small[name], 1e-300))
    exponential = {name for name, ratio in growth.items() if ratio > 50}
    assert exponential, growth  # the rule itself finds ρ's own metrics
    assert exponential <= {m.name for m in METRICS if m.exp_scale}, growth
