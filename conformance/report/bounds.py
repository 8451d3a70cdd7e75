"""What a check was held to, read back from report.json: why a bound is not the profile's, and
how close each judged check came to its bounds (the page's fraction-of-bound chart).

The reasons replay :meth:`conformance.profiles.Profile.bounds` one step at a time on the
profile the report records, so they are the run's own rules, not a restatement of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from conformance.metric_table import BY_NAME, metric
from conformance.profiles import MEAN_NOISE_SIGMAS, Profile
from conformance.report.html import number
from conformance.report.schema import Check, ProfileInfo
from conformance.report.stats import fraction_of_bound


@dataclass(frozen=True)
class Closeness:
    """One judged check's worst value as a fraction of its bound (1 = at the bound)."""

    check: Check
    metric: str
    value: float
    bound: float
    fraction: float


def closeness(check: Check) -> Closeness | None:
    """The bound ``check`` came closest to (or went furthest past), or None where the file
    records no bound it was held to that could fail (:func:`holds_nothing`)."""
    held = {name: pair for name, pair in check.held().items() if not holds_nothing(name, pair[1])}
    if not held:
        return None
    name = max(held, key=lambda m: fraction_of_bound(m, *held[m]))
    value, bound = held[name]
    return Closeness(check, name, value, bound, fraction_of_bound(name, value, bound))


def holds_nothing(name: str, bound: float) -> bool:
    """Whether a bound no value can break: a lower bound at or below 0 on a metric bounded
    from below (rates, ratios, probabilities and p-values are never negative; a pcc bound at
    0 is none a profile writes). The fp32 profile's ``exact_match_rate ≥ 0`` is one: drawn, its
    0.93 of the way to 1 would read as a stack about to fail."""
    fact = BY_NAME.get(name)
    return fact is not None and fact.bound == "min" and bound <= 0


def bound_reasons(profile: ProfileInfo, check: Check) -> dict[str, str]:
    """metric → why ``check``'s bound on it is not the profile's base threshold: the suite's
    own table, a per-sequence bound floored at its one-token metric's, a pool-scaled bound
    grown past the calibrated pool, a signed mean floored at its pool's noise. Metrics whose
    bound is the base one are left out."""
    # the rules of the metrics this version knows (a newer file's others are shown, not
    # explained)
    rules = Profile(
        profile.name,
        Path(profile.source or profile.name),
        _known(profile.thresholds),
        min_pooled_tokens=profile.min_pooled_tokens,
        max_pooled_tokens=profile.max_pooled_tokens,
        suites={name: _known(table) for name, table in profile.suites.items()},
    )
    own = profile.suites.get(check.suite, {})
    floored = rules.bounds(check.suite)
    grown = rules.bounds(check.suite, check.tokens)
    final = rules.bounds(check.suite, check.tokens, check.metrics)
    reasons: dict[str, str] = {}
    for name, bound in check.thresholds.items():
        if profile.thresholds.get(name) == bound or name not in BY_NAME:
            continue
        why = []
        if name in own:
            why.append(f"profile {profile.name}'s [suites.{check.suite}] table")
        one = metric(name).one_token
        if one and floored.get(name) != (rules.thresholds | own).get(name):
            why.append(
                f"raised to {one}'s bound {number(floored[name])}: over a one-token rollout it "
                f"is that token's {one}"
            )
        if grown.get(name) != floored.get(name) and check.tokens and profile.max_pooled_tokens:
            why.append(
                f"grown ×{number(math.sqrt(check.tokens / profile.max_pooled_tokens))} "
                f"(√ of the pool's {check.tokens} tokens over the {profile.max_pooled_tokens} "
                "the profile was calibrated on)"
            )
        if final.get(name) != grown.get(name):
            why.append(
                f"raised to {MEAN_NOISE_SIGMAS:g} standard errors of a mean over the pool's "
                f"{check.tokens} tokens"
            )
        if not why or not _same(final.get(name), bound):
            why.append(f"set by the run, not by profile {profile.name}'s rules")
        reasons[name] = "; ".join(why)
    return reasons


def _known(bounds: dict[str, float]) -> dict[str, float]:
    return {name: value for name, value in bounds.items() if name in BY_NAME}


def _same(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-12)
