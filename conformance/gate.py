"""The parity gate: is a candidate stack (a kernel change, a new engine version) as good as the
baseline it replaces?

Two report.json files made on the same suites, model, seed and example count are compared
suite by suite, metric by metric, on each metric's worst value over the suite's checks (the
one furthest from the metric's ideal value).

A metric *regresses* when its distance from the ideal value grew beyond the allowed factor::

    dev(v) = |v − ideal|        ideal: each metric's, from conformance.metric_table
    regressed  ⇔  dev(candidate) > factor × max(dev(baseline), floor)

The absolute floor keeps ratios of rounding noise out of the verdict: an fp32 stack measures
|Δlp| around 1e-7, and 3e-7 after a harmless change is not a 3× regression. Measuring the
distance from the ideal makes "higher is better" metrics (pcc 0.99999 → 0.999) regress by the
growth of their shortfall, the same rule as for "lower is better" ones.

Exit codes: 0 within profile and no regression; 1 otherwise, an incomplete candidate run
(crash, errored check) included; 2 not comparable (an incomplete baseline included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.errors import UsageError
from conformance.metric_table import BY_NAME, METRICS, worst_metrics
from conformance.profiles import load_profile
from conformance.report.html import as_text, code_block, join, number, page, table, tag
from conformance.report.schema import Report, as_report

if TYPE_CHECKING:
    from conformance.profiles import Profile

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR = 1e-6
OK, REGRESSED, NOT_COMPARABLE = 0, 1, 2


@dataclass(frozen=True)
class MetricRow:
    """One line of the gate table: a metric's worst value in one suite, before and after."""

    suite: str
    metric: str
    baseline: float | None
    candidate: float | None
    #: dev(candidate) / max(dev(baseline), floor); None when a side is missing or NaN
    ratio: float | None
    factor: float
    regressed: bool
    #: the baseline was at or below the floor, so the ratio is taken against the floor
    floored: bool = False

    @property
    def verdict(self) -> str:
        if self.regressed:
            return "REGRESSED"
        if self.baseline is None or self.candidate is None:
            return "only in " + ("candidate" if self.baseline is None else "baseline")
        return "ok"


@dataclass(frozen=True)
class GateResult:
    exit_code: int
    #: one line: why the gate passed, failed, or could not compare
    reason: str
    rows: list[MetricRow] = field(default_factory=list)
    #: one line per candidate check outside the profile, naming its violations
    violations: list[str] = field(default_factory=list)
    profile: str | None = None
    floor: float = DEFAULT_FLOOR
    baseline_command: str | None = None
    candidate_command: str | None = None

    def text_table(self) -> str:
        """The table metric by metric, as printed by ``tim-conformance gate``."""
        header = ("suite", "metric", "baseline", "candidate", "ratio", "allowed", "verdict")
        lines = [header] + [
            (
                r.suite,
                r.metric,
                _num(r.baseline),
                _num(r.candidate),
                _ratio(r),
                f"×{r.factor:g}",
                r.verdict,
            )
            for r in self.rows
        ]
        widths = [max(len(line[k]) for line in lines) for k in range(len(header))]
        out = [
            "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
        ]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(line.rstrip() for line in out)


def compare(
    baseline: Report | Mapping[str, Any],
    candidate: Report | Mapping[str, Any],
    *,
    profile: str | Path | Profile | None = None,
    max_regression: dict[str, float] | None = None,
    floor: float = DEFAULT_FLOOR,
) -> GateResult:
    """Gate ``candidate`` against ``baseline`` (reports, or decoded report.json files).

    ``profile``: a profile name, path or loaded Profile to hold the candidate to; by default
    the candidate's own thresholds (its checks' recorded violations) are used.
    ``max_regression``: allowed factor per metric name; others get ``DEFAULT_FACTOR``.
    """
    baseline, candidate = as_report(baseline, "baseline"), as_report(candidate, "candidate")
    factors = dict(max_regression or {})
    _validate_factors(factors, baseline, candidate)
    commands = {
        "baseline_command": baseline.command,
        "candidate_command": candidate.command,
    }
    if candidate.verdict == "incomplete":
        # a change that crashes the engine or errors a check fails the gate, it is not "n/a"
        reason = candidate.reason or "no reason given"
        return GateResult(REGRESSED, f"the candidate run is incomplete: {reason}", **commands)
    why_not = not_comparable(baseline, candidate)
    if why_not:
        return GateResult(NOT_COMPARABLE, f"not comparable: {why_not}", floor=floor, **commands)

    rows = regression_rows(baseline, candidate, factors, floor)
    profile_name, violations = profile_violations(candidate, profile)
    regressed = sorted((r for r in rows if r.regressed), key=lambda r: -(r.ratio or math.inf))
    problems = []
    if violations:
        problems.append(f"{len(violations)} check(s) outside profile {profile_name}")
    if regressed:
        names = ", ".join(f"{r.suite}/{r.metric} ×{_ratio(r).lstrip('×')}" for r in regressed[:4])
        more = f" and {len(regressed) - 4} more" if len(regressed) > 4 else ""
        problems.append(f"{len(regressed)} metric(s) regressed: {names}{more}")
    reason = "; ".join(problems) or (
        f"candidate within profile {profile_name} and no metric regressed beyond its factor"
    )
    return GateResult(
        REGRESSED if problems else OK,
        reason,
        rows,
        violations,
        profile_name,
        floor,
        **commands,
    )


def not_comparable(baseline: Report, candidate: Report) -> str | None:
    """Why the two reports cannot be compared (one line), or None when they can."""
    if baseline.verdict == "incomplete":
        return f"the baseline run is incomplete ({baseline.reason or 'no reason given'})"
    b_checks, c_checks = _check_ids(baseline), _check_ids(candidate)
    if b_checks != c_checks:
        only_b, only_c = sorted(b_checks - c_checks), sorted(c_checks - b_checks)
        parts = []
        if only_b:
            parts.append(f"only the baseline ran {_few(only_b)}")
        if only_c:
            parts.append(f"only the candidate ran {_few(only_c)}")
        return "different checks: " + "; ".join(parts)
    b_model, c_model = baseline.stack.model_sha256, candidate.stack.model_sha256
    if b_model != c_model:
        return f"different models (sha256 {b_model[:12]}… vs {c_model[:12]}…)"
    for key in ("seed", "examples"):
        b, c = getattr(baseline, key), getattr(candidate, key)
        if b != c:
            return f"different {key} ({b} vs {c}); rerun both with the same --{key}"
    return None


def regression_rows(
    baseline: Report, candidate: Report, factors: dict[str, float], floor: float
) -> list[MetricRow]:
    rows = []
    b_suites, c_suites = baseline.suites(), candidate.suites()
    for suite, b_checks in b_suites.items():
        b_worst = worst_metrics(c.metrics for c in b_checks)
        c_worst = worst_metrics(c.metrics for c in c_suites.get(suite, []))
        for metric in sorted(b_worst.keys() | c_worst.keys()):
            factor = factors.get(metric, DEFAULT_FACTOR)
            b, c = b_worst.get(metric), c_worst.get(metric)
            if b is None or c is None:
                rows.append(MetricRow(suite, metric, b, c, None, factor, False))
                continue
            fact = BY_NAME[metric]
            ref = max(fact.deviation(b), floor) if not math.isnan(b) else math.nan
            dev_c = fact.deviation(c)
            ratio = dev_c / ref if not (math.isnan(ref) or math.isnan(dev_c)) else None
            # a NaN in the candidate means the measurement broke: always a regression
            regressed = math.isnan(c) or (ratio is not None and ratio > factor)
            floored = not math.isnan(b) and fact.deviation(b) < floor
            rows.append(MetricRow(suite, metric, b, c, ratio, factor, regressed, floored))
    return rows


def profile_violations(
    candidate: Report, profile: str | Path | Profile | None
) -> tuple[str, list[str]]:
    """The profile's name and one line per candidate check that breaks it.

    Without ``profile`` the candidate's own verdicts count: its recorded violations, and any
    check that failed or errored (per-example checks fail without a pooled violation).
    """
    if isinstance(profile, str | Path):
        profile = load_profile(profile)
    lines = []
    for check in candidate.checks:
        found = (
            check.violations
            if profile is None
            else profile.check(check.metrics, tokens=check.tokens, suite=check.suite)
        )
        where = f"{check.suite}/{check.name}"
        if found:
            shown = "; ".join(
                f"{v.metric} = {as_text(v.value)} vs {as_text(v.threshold)}" for v in found[:3]
            )
            more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
            lines.append(f"{where}: {shown}{more}")
        elif profile is None and check.status in ("fail", "error"):
            lines.append(f"{where}: {check.status}: {check.message}".rstrip())
    return (candidate.profile.name if profile is None else profile.name), lines


def write_gate_html(result: GateResult, out: Path) -> Path:
    """The gate's verdict and table as a self-contained HTML diff report."""
    word, cls = {
        OK: ("GATE PASSED", "ok"),
        REGRESSED: ("GATE FAILED", "bad"),
        NOT_COMPARABLE: ("NOT COMPARABLE", "warn"),
    }[result.exit_code]
    body: list[object] = [
        tag(
            "header",
            join([tag("div", word, cls="verdict-word"), tag("div", result.reason, cls="why")]),
            cls=f"verdict {cls}",
            id="verdict",
        ),
        tag("h3", "Baseline"),
        code_block(result.baseline_command or "—"),
        tag("h3", "Candidate"),
        code_block(result.candidate_command or "—"),
    ]
    if result.rows:
        rows = [
            [
                r.suite,
                tag("code", r.metric),
                tag("span", _num(r.baseline), cls="num"),
                tag("span", _num(r.candidate), cls="num"),
                _ratio(r),
                f"×{r.factor:g}",
                tag("span", r.verdict, cls="mark " + ("fail" if r.regressed else "pass")),
            ]
            for r in result.rows
        ]
        body += [
            tag("h2", "Metrics (worst per suite)"),
            table(
                ["suite", "metric", "baseline", "candidate", "ratio", "allowed", "verdict"],
                rows,
                cls="metrics gate",
            ),
            tag("p", ratio_note(result.floor), cls="sub"),
        ]
    if result.violations:
        body += [
            tag("h2", f"Checks outside profile {result.profile}"),
            tag("ul", join(tag("li", line) for line in result.violations)),
        ]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page("tim-conformance gate", tag("main", join(body))), "utf-8")
    return out


def ratio_note(floor: float) -> str:
    return (
        f"ratio = |candidate − ideal| / max(|baseline − ideal|, {floor:g}); ideal = 1 for "
        f"{', '.join(m.name for m in METRICS if m.ideal == 1)}, else 0. A ratio marked * is "
        "taken against the floor "
        "because the baseline was below it."
    )


def parse_factors(specs: list[str]) -> dict[str, float]:
    """``["abs_diff_max=3", ...]`` → ``{"abs_diff_max": 3.0}`` (the --max-regression values)."""
    factors = {}
    for spec in specs:
        metric, _, value = (part.strip() for part in spec.partition("="))
        try:
            factors[metric] = float(value)
        except ValueError:
            raise UsageError(
                f"--max-regression {spec!r} is not METRIC=FACTOR", "write e.g. abs_diff_max=3"
            ) from None
        if not metric:
            raise UsageError(
                f"--max-regression {spec!r} names no metric", "write e.g. abs_diff_max=3"
            )
    return factors


def _validate_factors(factors: dict[str, float], *reports: Report) -> None:
    known = {m for r in reports for c in r.checks for m in c.metrics}
    for metric, factor in factors.items():
        if metric not in known:
            raise UsageError(
                f"--max-regression names unknown metric {metric!r}",
                f"use one of: {', '.join(sorted(known)) or '(the reports have no metrics)'}",
            )
        if not (math.isfinite(factor) and factor >= 1):
            raise UsageError(f"--max-regression {metric}={factor:g}", "use a finite factor >= 1")


def _check_ids(report: Report) -> set[str]:
    return {c.nodeid for c in report.checks}


def _few(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")


def _num(v: float | None) -> str:
    return "—" if v is None else number(v)


def _ratio(row: MetricRow) -> str:
    if row.ratio is None:
        return "—"
    return f"×{row.ratio:.3g}" + ("*" if row.floored else "")
