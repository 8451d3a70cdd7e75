"""The two verdicts of a smoke run — mismatch alarm and collapse — as pure functions of its rows.

A row is one step of ``rl.jsonl``: a dict with ``step`` and the step's signals (``reward``,
``entropy``, ``grad_norm``, ``response_length``, and ``mismatch`` = the step's
``mismatch_metrics``). Each rule returns the step at which it is *confirmed* (the earliest step at
which a monitor watching the run live would know), so a verdict's step is never in hindsight.
The thresholds are calibrated on measured runs: see ``docs/rl-detectors.md`` and
``python tools/rl_detector_record.py``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.profiles import Profile

Row = Mapping[str, Any]

#: the mismatch metric the paper calls "mismatch": std of ρ over a step's tokens
STD_RHO = "rho_std"
PCC = "pcc"
#: row field: fraction of a step's tokens with ρ outside [1/2, 2] (the TIS/MIS cap C = 2)
OUTSIDE = "rho_outside_frac"


@dataclass(frozen=True)
class Firing:
    rule: str
    step: int
    reason: str


@dataclass(frozen=True)
class Verdict:
    fired: bool
    step: int | None
    signal: str | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """The summary form of issue 6: ``fired``, ``step``, ``reason`` (naming the signal)."""
        reason = f"{self.signal}: {self.reason}" if self.signal else self.reason
        return {"fired": self.fired, "step": self.step, "reason": reason}


@dataclass(frozen=True)
class MismatchRules:
    """Alarm thresholds (calibrated in docs/rl-detectors.md)."""

    #: std ρ above this is too high whatever the history (level vs the bf16 profile)
    level_max: float = 0.05
    #: growth: rolling median of std ρ above ``growth_factor`` × its early baseline …
    growth_factor: float = 3.0
    #: … and above this absolute floor (growth of fp32 rounding noise is not a mismatch)
    growth_floor: float = 0.01
    #: PCC of π_train vs π_infer below this
    pcc_min: float = 0.99
    #: more than this fraction of tokens with ρ outside [1/2, 2]
    outside_max: float = 0.02
    baseline_steps: int = 5
    window: int = 3
    persist: int = 2


@dataclass(frozen=True)
class CollapseRules:
    """Collapse thresholds (calibrated in docs/rl-detectors.md)."""

    #: rolling reward below this fraction of its running peak …
    reward_frac: float = 0.5
    #: … once the peak is at least this (a run that never learned cannot collapse)
    min_peak: float = 0.1
    #: rolling entropy above ``entropy_factor`` × baseline
    entropy_factor: float = 3.0
    #: rolling grad norm above ``grad_factor`` × the median of all earlier steps (smoothed and
    #: sustained like the others: single 40× spikes occur in healthy long-answer runs)
    grad_factor: float = 10.0
    #: rolling response length above ``length_factor`` × baseline (lr-scheduling §3.3: "triple")
    length_factor: float = 2.0
    baseline_steps: int = 5
    window: int = 5
    persist: int = 3


def mismatch_value(row: Row, key: str) -> float:
    value = row["mismatch"].get(key)
    return math.nan if value is None else float(value)


def rolling_median(values: Sequence[float], window: int) -> list[float]:
    """Median of the last ``window`` values at each step (fewer at the start); NaN ignored."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(statistics.median(recent) if recent else math.nan)
    return out


def first_sustained(flags: Sequence[bool], persist: int) -> int | None:
    """Index at which ``flags`` has first been true ``persist`` steps in a row."""
    run = 0
    for i, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run >= persist:
            return i
    return None


def _baseline(values: Sequence[float], steps: int) -> float:
    head = [v for v in values[:steps] if not math.isnan(v)]
    return statistics.median(head) if head else math.nan


def _firing(rows: Sequence[Row], rule: str, index: int | None, reason: Callable[[int], str]):
    return None if index is None else Firing(rule, int(rows[index]["step"]), reason(index))


def mismatch_firings(
    rows: Sequence[Row], rules: MismatchRules = MismatchRules(), profile: Profile | None = None
) -> list[Firing]:
    """Every mismatch rule that fired, each at its confirming step.

    With a ``profile`` (the stack's tolerance profile), the ``profile`` rule fires when a step's
    ``mismatch_metrics`` violate it for ``persist`` steps in a row: the level vs the profile.
    """
    violations = [profile.check(r["mismatch"]) if profile else [] for r in rows]
    std = [mismatch_value(r, STD_RHO) for r in rows]
    smooth = rolling_median(std, rules.window)
    base = _baseline(std, rules.baseline_steps)
    pcc = rolling_median([mismatch_value(r, PCC) for r in rows], rules.window)
    outside = rolling_median([float(r[OUTSIDE]) for r in rows], rules.window)
    after_base = [i >= rules.baseline_steps for i in range(len(rows))]
    found = [
        _firing(
            rows,
            "level",
            first_sustained([s > rules.level_max for s in smooth], rules.persist),
            lambda i: f"std ρ {smooth[i]:.3g} > {rules.level_max:g}",
        ),
        _firing(
            rows,
            "growth",
            first_sustained(
                [
                    a and s > rules.growth_floor and s > rules.growth_factor * base
                    for a, s in zip(after_base, smooth, strict=True)
                ],
                rules.persist,
            ),
            lambda i: f"std ρ {smooth[i]:.3g} > {rules.growth_factor:g}× baseline {base:.3g}",
        ),
        _firing(
            rows,
            "pcc",
            first_sustained([p < rules.pcc_min for p in pcc], rules.persist),
            lambda i: f"PCC(π_train, π_infer) {pcc[i]:.4f} < {rules.pcc_min:g}",
        ),
        _firing(
            rows,
            "extremes",
            first_sustained([o > rules.outside_max for o in outside], rules.persist),
            lambda i: (
                f"{outside[i]:.2%} of tokens with ρ outside [1/2, 2] > {rules.outside_max:.0%}"
            ),
        ),
    ]
    if profile is not None:
        found.append(
            _firing(
                rows,
                "profile",
                first_sustained([bool(v) for v in violations], rules.persist),
                lambda i: (
                    f"{len(violations[i])} metrics outside profile {profile.name!r}: "
                    + ", ".join(f"{v.metric} {v.value:.3g}" for v in violations[i][:3])
                ),
            )
        )
    return [f for f in found if f is not None]


def collapse_firings(rows: Sequence[Row], rules: CollapseRules = CollapseRules()) -> list[Firing]:
    """Every collapse rule that fired, each at its confirming step."""
    reward = rolling_median([float(r["reward"]) for r in rows], rules.window)
    peak = [max(reward[: i + 1]) for i in range(len(reward))]
    entropy = [float(r["entropy"]) for r in rows]
    length = [float(r["response_length"]) for r in rows]
    grad = [float(r["grad_norm"]) for r in rows]
    ent_smooth = rolling_median(entropy, rules.window)
    len_smooth = rolling_median(length, rules.window)
    ent_base = _baseline(entropy, rules.baseline_steps)
    len_base = _baseline(length, rules.baseline_steps)
    grad_smooth = rolling_median(grad, rules.window)
    grad_ref = [
        statistics.median(grad[:i]) if i >= rules.baseline_steps else math.inf
        for i in range(len(grad))
    ]
    found = [
        _firing(
            rows,
            "reward",
            first_sustained(
                [
                    p >= rules.min_peak and r < rules.reward_frac * p
                    for r, p in zip(reward, peak, strict=True)
                ],
                rules.persist,
            ),
            lambda i: f"reward {reward[i]:.3f} < {rules.reward_frac:g}× peak {peak[i]:.3f}",
        ),
        _firing(
            rows,
            "entropy",
            first_sustained(
                [e > rules.entropy_factor * ent_base for e in ent_smooth], rules.persist
            ),
            lambda i: (
                f"entropy {ent_smooth[i]:.3f} > {rules.entropy_factor:g}× baseline {ent_base:.3f}"
            ),
        ),
        _firing(
            rows,
            "grad_norm",
            first_sustained(
                [g > rules.grad_factor * m for g, m in zip(grad_smooth, grad_ref, strict=True)],
                rules.persist,
            ),
            lambda i: (
                f"grad norm {grad_smooth[i]:.3g} > {rules.grad_factor:g}× median {grad_ref[i]:.3g}"
            ),
        ),
        _firing(
            rows,
            "length",
            first_sustained(
                [s > rules.length_factor * len_base for s in len_smooth], rules.persist
            ),
            lambda i: (
                f"response length {len_smooth[i]:.1f} > {rules.length_factor:g}× "
                f"baseline {len_base:.1f}"
            ),
        ),
    ]
    return [f for f in found if f is not None]


def verdict(firings: Sequence[Firing], quiet: str) -> Verdict:
    """The earliest firing, or a quiet verdict saying what was watched."""
    if not firings:
        return Verdict(fired=False, step=None, signal=None, reason=quiet)
    first = min(firings, key=lambda f: f.step)
    return Verdict(fired=True, step=first.step, signal=first.rule, reason=first.reason)


def mismatch_alarm(
    rows: Sequence[Row], rules: MismatchRules = MismatchRules(), profile: Profile | None = None
) -> Verdict:
    watched = "std ρ, its growth, PCC and ρ extremes" + (
        f", profile {profile.name!r}" if profile else ""
    )
    return verdict(mismatch_firings(rows, rules, profile), f"{watched} within bounds")


def collapse(rows: Sequence[Row], rules: CollapseRules = CollapseRules()) -> Verdict:
    return verdict(
        collapse_firings(rows, rules), "reward, entropy, grad norm and response length stable"
    )


def lead_steps(alarm: Verdict, collapsed: Verdict) -> int | None:
    """Steps from the first mismatch alarm to the collapse (negative: the alarm came later)."""
    if alarm.step is None or collapsed.step is None:
        return None
    return collapsed.step - alarm.step


#: reward "actually dropped" at the first step t ≥ at whose next DROP_SPAN rewards average below
#: DROP_FRACTION × the mean of the DROP_SPAN steps before ``at`` (hindsight, unlike the detector)
DROP_SPAN = 5
DROP_FRACTION = 0.5


def reward_drop_step(rows: Sequence[dict[str, Any]], at: int) -> int | None:
    """The hindsight reference for "the reward actually dropped" (see ``DROP_FRACTION``)."""
    rewards = [float(r["reward"]) for r in rows]
    before = rewards[max(0, at - DROP_SPAN) : at]
    if not before:
        return None
    level = DROP_FRACTION * statistics.mean(before)
    for t in range(at, len(rewards) - DROP_SPAN + 1):
        if statistics.mean(rewards[t : t + DROP_SPAN]) < level:
            return t
    return None
