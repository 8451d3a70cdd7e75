"""The verdict in words: its word, what a pass of some suites does not cover, and the table
printed at the end of a run (pytest's summary and ``certify``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from conformance.metric_table import HEADLINE_METRICS
from conformance.report.schema import Check, Report

#: violations named on a failed check's ``bound:`` line; the rest are in report.json
SHOWN_VIOLATIONS = 3
#: each verdict in a word
VERDICT_WORDS = {"pass": "CERTIFIED", "fail": "NOT CERTIFIED", "incomplete": "INCOMPLETE"}


def verdict_word(report: Report) -> str:
    """The verdict in a word: a pass of some suites (``scope: suites``) is PASSED, not
    CERTIFIED."""
    if report.verdict == "pass" and report.scope == "suites":
        return "PASSED"
    return VERDICT_WORDS[report.verdict]


def scope_note(report: Report) -> str:
    """What a pass of some suites does not cover (empty for anything else)."""
    if report.verdict != "pass" or report.scope != "suites":
        return ""
    return (
        f"on suite(s) {', '.join(report.suites())} only — not a certificate of the stack "
        "(run every suite to certify it)"
    )


def verdict_lines(report: Report, report_dir: Path | None) -> list[str]:
    """One row per check (status: PASS, REPORTED, NOT REACHED, FAIL, ERROR, INTERRUPTED;
    headline metrics, ``*`` marking one its verdict did not judge), then the verdict line."""
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
                # a pass says what it came to, as the page does: held to a bound, reported
                # (measured, held to none) or not reached
                (check.judgement if check.status == "pass" else check.status).upper(),
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
            lines += failure_lines(check)
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


def failure_lines(check: Check) -> list[str]:
    """A failed (errored, interrupted) check in a few lines: its message (the failing case's
    metric, value and bound); the bounds its examples broke (report.json's ``violations``);
    the case it failed on — Hypothesis's shrunk one — in sizes (the ids are in report.json); and
    the command that replays it."""
    lines = [f"{check.status.upper()} {check.nodeid}: {check.message}"]
    if check.violations:
        shown = "; ".join(str(v) for v in check.violations[:SHOWN_VIOLATIONS])
        more = len(check.violations) - SHOWN_VIOLATIONS
        lines.append(
            f"  bounds broken: {shown}" + (f" (+{more} more in report.json)" if more > 0 else "")
        )
    lines += [f"  not judged: {why}" for why in dict.fromkeys(check.not_judged.values())]
    case = check.worst_case
    if case:
        described = case_summary(case)
        if check.shrink is not None and check.shrink.cut_short:
            described += (
                f"; shrinking cut short after {check.shrink.seconds:.0f} s: it may not be "
                "minimal (--shrink-seconds)"
            )
        lines.append(f"  case: {described} (token ids in report.json)")
        if case.get("replay"):
            lines.append(f"  replay: {case['replay']}")
    return lines


#: sampling values a case summary leaves out when they are these (SamplingSpec's defaults)
_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "n": 1}


def case_summary(case: dict[str, object]) -> str:
    """A recorded case (``Check.worst_case``) in sizes: its sequences and their prompt
    lengths, new tokens and the sampling values that are not the defaults."""
    prompts = case.get("prompt_ids")
    parts = []
    if isinstance(prompts, list) and prompts:
        lengths = [len(p) for p in prompts if isinstance(p, list)]
        if lengths:
            low, high = min(lengths), max(lengths)
            span = f"{low}" if low == high else f"{low}–{high}"
            sequences = "1 sequence" if len(lengths) == 1 else f"{len(lengths)} sequences"
            prompt = "prompt" if len(lengths) == 1 else "prompts"
            parts.append(f"{sequences}, {prompt} of {span} token{'' if high == 1 else 's'}")
    sampling = case.get("sampling")
    if isinstance(sampling, dict):
        new = sampling.get("max_new_tokens")
        parts.append(f"{new} new token{'' if new == 1 else 's'}")
        parts += [
            f"{name} {sampling[name]}"
            for name, default in _SAMPLING_DEFAULTS.items()
            if sampling.get(name, default) != default
        ]
    return ", ".join(parts) or "recorded"
