"""The verdict table printed at the end of a run (pytest's summary and ``certify``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from conformance.metric_table import HEADLINE_METRICS
from conformance.report.page import scope_note, verdict_word
from conformance.report.schema import Report


def verdict_lines(report: Report, report_dir: Path | None) -> list[str]:
    """One row per check (status, headline metrics; ``*`` marks one its verdict did not
    judge), then the verdict line."""
    rows = [("suite", "check", "status", *HEADLINE_METRICS)]
    skipped = [c for c in report.checks if c.status == "skip"]
    starred = False
    for check in report.checks:
        if check.status == "skip":
            continue
        metrics = check.metrics
        starred |= any(m in metrics for m in check.not_judged if m in HEADLINE_METRICS)
        rows.append(
            (
                check.suite,
                check.name,
                check.status.upper(),
                *(
                    f"{metrics[m]:.3g}{'*' * (m in check.not_judged)}" if m in metrics else "-"
                    for m in HEADLINE_METRICS
                ),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    if starred:
        lines.append("* not judged: the check's verdict did not apply that bound (why: below)")
    if skipped:
        # every distinct reason, once each: a skip hides a property from the verdict
        reasons = Counter(c.message for c in skipped)
        lines.append(f"skipped {len(skipped)}:")
        lines += [
            f"  {r}" + (f" ({n} checks)" if n > 1 else "") for r, n in sorted(reasons.items())
        ]
    for check in report.checks:
        if check.status == "pass" and check.message:
            # what a passing check reports (a measurement not judged) or could not cover
            lines.append(f"NOTE {check.nodeid}: {check.message}")
        if check.status in ("fail", "error", "interrupted"):
            lines.append(f"{check.status.upper()} {check.nodeid}: {check.message}")
            for why in dict.fromkeys(check.not_judged.values()):
                lines.append(f"  not judged: {why}")
            if check.shrink is not None and check.shrink.cut_short:
                lines.append(
                    f"  shrinking cut short after {check.shrink.seconds:.0f} s: the recorded "
                    "case may not be minimal (--shrink-seconds)"
                )
    stack = report.stack
    verdict = f"verdict: {verdict_word(report)}"
    for why in (report.reason, scope_note(report)):
        if why:
            verdict += f" — {why}"
    lines += [
        verdict,
        f"stack: {stack['engine']} ({stack['engine_dtype']}) vs {stack['backend']} "
        f"({stack['backend_dtype']}), profile {report.profile.name}, seed {report.seed}, "
        f"fingerprint {stack['fingerprint'][:16]}",
    ]
    if report.profile.foreign:
        lines.append(f"profile warning: {report.profile.foreign}")
    if report_dir is not None:
        lines.append(f"report: {report_dir / 'report.json'}")
    return lines
