"""Reading report.json (schema 1, see docs) and the per-metric facts the report and gate share."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from conformance.errors import UsageError

SCHEMA = 1

#: metrics whose profile threshold is a lower bound (higher is better); all others are upper
#: bounds. Mirrors ``conformance.profiles.LOWER_BOUNDS``, which cannot be imported here
#: (profiles validates names against the metrics module, which needs torch); a test keeps
#: the two equal.
LOWER_BOUND_METRICS = frozenset({"pcc", "exact_match_rate", "rho_min"})


def load_report(path: Path) -> dict:
    """Read and validate a report.json; any problem is one-line UsageError naming the fix."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"no report at {path}", "pass the report.json that certify or --tim-report wrote"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", "pass a readable report.json") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path} is not JSON ({exc.msg} at line {exc.lineno})",
            "pass the report.json itself, not results.jsonl or an HTML file",
        ) from None
    validate_report(report, str(path))
    return report


def validate_report(report: object, where: str = "report") -> None:
    """Check the fields the report, the certificate and the gate rely on."""
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise UsageError(
            f"{where} is not a schema-{SCHEMA} report.json (schema: {found!r})",
            "regenerate it with this version of tim-conformance",
        )
    checks = report.get("checks")
    if not isinstance(checks, list) or not all(
        isinstance(c, dict) and isinstance(c.get("suite"), str) for c in checks
    ):
        raise UsageError(
            f"{where} has no valid 'checks' list", "regenerate it with tim-conformance certify"
        )
    if not isinstance(report.get("stack"), dict):
        raise UsageError(f"{where} has no 'stack' object", "regenerate it with certify")


def is_lower_bound(metric: str) -> bool:
    return metric in LOWER_BOUND_METRICS


def worst(metric: str, values: Iterable[float]) -> float | None:
    """The worst finite-or-not value of ``metric``: the minimum for lower bounds, else the max.

    NaN counts as worst of all, since a NaN metric means the measurement broke.
    """
    vals = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not vals:
        return None
    nans = [v for v in vals if math.isnan(v)]
    if nans:
        return nans[0]
    return min(vals) if is_lower_bound(metric) else max(vals)


def worst_metrics(checks: Iterable[dict]) -> dict[str, float | None]:
    """Per metric name, the worst value over ``checks``' ``metrics`` dicts (sorted by name)."""
    values: dict[str, list[float]] = {}
    for check in checks:
        for name, value in (check.get("metrics") or {}).items():
            values.setdefault(name, []).append(value)
    return {name: worst(name, values[name]) for name in sorted(values)}


def suites(report: dict) -> dict[str, list[dict]]:
    """Checks grouped by suite, in first-seen order."""
    grouped: dict[str, list[dict]] = {}
    for check in report["checks"]:
        grouped.setdefault(check["suite"], []).append(check)
    return grouped
