"""Reading report.json (schema 1, see docs)."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.errors import UsageError

SCHEMA = 1


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


def suites(report: dict) -> dict[str, list[dict]]:
    """Checks grouped by suite, in first-seen order."""
    grouped: dict[str, list[dict]] = {}
    for check in report["checks"]:
        grouped.setdefault(check["suite"], []).append(check)
    return grouped
