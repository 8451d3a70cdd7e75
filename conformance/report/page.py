"""report.json → one self-contained HTML page: verdict first, then stack, suites, RL curves."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.metric_table import BY_NAME, HEADLINE_METRICS, worst_metrics
from conformance.report import plots
from conformance.report.bounds import bound_reasons, closeness, holds_nothing
from conformance.report.html import Markup, as_text, code_block, esc, join, page, table, tag
from conformance.report.schema import (
    BOUND_NOTE,
    FAILED,
    Check,
    Judgement,
    ProfileInfo,
    Report,
    as_report,
)
from conformance.report.stats import fraction_of_bound, pool_samples
from conformance.report.summary import scope_note, verdict_word

#: failing checks shown in full per suite; the rest are listed in one line each
MAX_DETAILED_FAILURES = 20
#: rows of any per-check listing; the full data stays in report.json
MAX_LISTED_CHECKS = 200
#: tokens pooled per suite for its plots and their statistics (failing checks first)
MAX_PLOTTED_TOKENS = 20_000
#: prompt ids shown per sequence of a reproducer (the replay command carries the full case)
MAX_PROMPT_IDS = 256
#: prompts shown of a reproducer's batch
MAX_PROMPTS = 16

#: each verdict's colour on the page
VERDICT_CLASSES = {"pass": "ok", "fail": "bad", "incomplete": "warn"}
#: how each judgement reads: a tick for a check held to a bound, and for nothing else
JUDGEMENT_MARK: dict[Judgement, str] = {
    "pass": "✔ pass",
    "fail": "✘ fail",
    "reported": "○ reported, not judged",
    "skipped": "– skipped",
    "not reached": "– not reached",
}
JUDGEMENTS: tuple[Judgement, ...] = tuple(JUDGEMENT_MARK)


def render_html(report: Report | Mapping[str, Any], *, rl_curves: list[dict] | None = None) -> str:
    """The report page as a string (see ``write_html``)."""
    report = as_report(report)
    grouped = report.suites()
    body = [
        verdict_banner(report),
        closeness_section(report.checks),
        run_table(report),
        coverage_table(report),
        suite_overview(grouped),
    ]
    body += [suite_section(name, checks, report.profile) for name, checks in grouped.items()]
    if report.rl or rl_curves:
        body.append(rl_section(report.rl or {}, rl_curves or []))
    body.append(tag("footer", f"tim-conformance report · {report.created}"))
    return page("tim-conformance report", tag("main", join(body)))


def write_html(
    report: Report | Mapping[str, Any], out: Path, *, rl_curves: list[dict] | None = None
) -> Path:
    """Write the report page to ``out`` and return it.

    When ``rl_curves`` is None and the report's ``rl.curves_path`` names a file next to ``out``
    (as certify lays them out), the curves are read from there.
    """
    out = Path(out)
    report = as_report(report)
    if rl_curves is None:
        rl_curves = load_rl_curves(out.parent, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report, rl_curves=rl_curves), "utf-8")
    return out


def load_rl_curves(report_dir: Path, report: Report) -> list[dict] | None:
    """The RL smoke run's per-step rows (``rl.jsonl``) when report.json points at them."""
    rl = report.rl
    if not rl or not rl.get("curves_path"):
        return None
    path = Path(report_dir) / str(rl["curves_path"])
    if not path.is_file():
        return None
    rows = []
    for line in path.read_text("utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a torn last line; the rest is still good
        if isinstance(row, dict):
            rows.append(row)
    return rows


def verdict_banner(report: Report) -> Markup:
    """The verdict in a word, the checks by judgement, and the warnings a reader must see
    before trusting it: a pass of some suites only, a release newer than tested."""
    cls, word = VERDICT_CLASSES[report.verdict], verdict_word(report)
    if scope_note(report):
        cls = "scoped"  # not the certificate's green: it certifies no stack
    judged = Counter(c.judgement for c in report.checks)
    counts = [f"{judged['pass']} of {len(report.checks)} checks passed"] + [
        f"{judged[j]} {'failed' if j == 'fail' else j}" for j in JUDGEMENTS[1:] if judged[j]
    ]
    detail = ", ".join(counts)
    for why in (report.reason, scope_note(report)):
        if why:
            detail += f" — {why}"
    lines: list[object] = [
        tag("div", word, cls="verdict-word"),
        tag("div", join([tag("b", f"profile {report.profile.name}"), " · ", detail]), cls="why"),
    ]
    lines += [tag("div", f"⚠ {line}", cls="why warn") for line in release_warnings(report)]
    return tag("header", join(lines), cls=f"verdict {cls}", id="verdict")


def release_warnings(report: Report) -> list[str]:
    """One line per engine or backend whose installed release is not one it was tested on
    (the ``release`` record its info holds), as certify warned."""
    lines = []
    for side in ("engine", "backend"):
        release = (report.stack.get(f"{side}_info") or {}).get("release")
        if isinstance(release, dict) and release.get("standing") not in (None, "supported"):
            lines.append(
                f"{release.get('package')} {release.get('installed')} is "
                f"{release.get('standing')} by {side} {report.stack[side]!r} "
                f"(tested: {release.get('supported')})"
            )
    return lines


def closeness_section(checks: list[Check]) -> Markup:
    """The fraction-of-bound chart of every judged check that records a bound, and the ones
    that could not be drawn."""
    rows = [row for c in checks if c.judgement in ("pass", "fail") and (row := closeness(c))]
    undrawn = [c for c in checks if c.judgement in ("pass", "fail") and closeness(c) is None]
    parts: list[object] = [tag("h2", "How close each check came to its bound")]
    if rows:
        parts.append(tag("div", plots.closeness_chart(rows), cls="closeness"))
    parts.append(
        tag(
            "p",
            "each judged check's worst metric as a fraction of its bound: its departure from "
            "the metric's ideal over the departure the bound allows (for a lower bound such as "
            "pcc ≥ 1 − 1e-6, a pcc of 1 − 5e-7 is 0.5); past the line at 1 a check fails. "
            "Log scale; a check at its ideal value is drawn at the left edge.",
            cls="sub",
        )
    )
    if undrawn:
        parts.append(
            tag(
                "p",
                f"not drawn ({len(undrawn)}), judged without a bound the report records: "
                + ", ".join(f"{c.name} ({_judgement_text(c)})" for c in undrawn[:20])
                + (" …" if len(undrawn) > 20 else ""),
                cls="sub",
            )
        )
    return tag("section", join(parts), id="closeness")


def calibrated_on(provenance: dict[str, Any] | None) -> str:
    """A profile's provenance in one line: models, device, torch, depth and date."""
    if not provenance:
        return "— (no [provenance]: not written by tim-conformance calibrate)"
    models = ", ".join(
        f"{m.get('arch', '?')} {str(m.get('sha256', ''))[:12]}"
        for m in provenance.get("models", [])
    )
    device = provenance.get("device") or {}
    return (
        f"{models} on {device.get('kind', '?')} {device.get('name', '?')}, torch "
        f"{(provenance.get('versions') or {}).get('torch', '?')}, depth "
        f"{provenance.get('depth', '?')}, {str(provenance.get('created', '?'))[:10]}"
    )


def run_table(report: Report) -> Markup:
    """Fingerprint, stack, profile, seed and the command that replays the run."""
    # the stack's required fields are validated; the rest is what the engine and backend
    # chose to report, shown when there
    stack, profile = report.stack, report.profile
    model = stack["model"]
    rows: list[tuple[str, object]] = [
        ("fingerprint", tag("code", stack["fingerprint"])),
        ("engine", f"{stack['engine']} ({stack['engine_dtype']})"),
        ("backend", f"{stack['backend']} ({stack['backend_dtype']})"),
        ("parallelism", _pairs(stack.get("parallelism")) or "none: engine and backend unsplit"),
        (
            "model",
            f"{model.get('path', '—')}  "
            f"[{model.get('arch', '?')}, vocab {model.get('vocab_size', '?')}]",
        ),
        ("model sha256", tag("code", stack.model_sha256)),
        ("versions", _pairs(stack.get("versions"))),
        ("device", _pairs(stack.get("device"))),
        ("environment", _pairs(stack.get("env")) or "—"),
        ("profile", f"{profile.name}  {profile.source or ''}"),
        ("calibrated on", calibrated_on(profile.provenance)),
        *([("profile warning", profile.foreign)] if profile.foreign else []),
        ("thresholds", _pairs(profile.thresholds)),
        *((f"thresholds, suite {name}", _pairs(bounds)) for name, bounds in profile.suites.items()),
        ("seed · examples", f"{report.seed} · {report.examples}"),
    ]
    for key in ("engine_info", "backend_info"):
        info = stack.get(key)
        if isinstance(info, dict) and info:
            # one row per field, a nested record's fields inline: readable, never raw JSON
            details = [
                (k, _pairs(v) if isinstance(v, dict) else as_text(v)) for k, v in info.items()
            ]
            rows.append((key.replace("_", " "), table(["", ""], details, cls="kv inner")))
    return join(
        [
            tag("section", table(["", ""], rows, cls="kv"), cls="run"),
            tag("h3", "Reproduce"),
            code_block(report.command or "—"),
        ]
    )


def suite_status(counts: Counter) -> Judgement:
    """A suite fails if any check did; it passed only if a check passed (and none failed);
    else it reads as its checks do: reported, not reached, skipped (in that order)."""
    return next((j for j in ("fail", "pass", "reported", "not reached") if counts[j]), "skipped")


def coverage_table(report: Report) -> Markup:
    """The model's distinguishing features and how many judged checks reached each; empty
    for a model with none (a plain dense decoder)."""
    if not report.coverage:
        return Markup("")
    rows = [
        [
            _mark("pass" if f.reached_by else "fail", "✔" if f.reached_by else "✘ not reached"),
            tag("code", f.name),
            f.what,
            f"from position {f.from_position}" if f.from_position else "every token",
            len(f.reached_by),
        ]
        for f in report.coverage
    ]
    return join(
        [
            tag("h2", "Model features reached"),
            table(["", "feature", "in this model", "acts", "checks reaching it"], rows),
        ]
    )


def suite_overview(grouped: dict[str, list[Check]]) -> Markup:
    rows = []
    for name, checks in grouped.items():
        counts = Counter(c.judgement for c in checks)
        link = Markup(f'<a href="#suite-{esc(_anchor(name))}">{esc(name)}</a>')
        status = suite_status(counts)
        rows.append([link, _mark(status), len(checks), *(counts[j] for j in JUDGEMENTS)])
    return join(
        [
            tag("h2", "Suites"),
            table(["suite", "", "checks", *JUDGEMENTS], rows, cls="overview"),
        ]
    )


def suite_section(name: str, checks: list[Check], profile: ProfileInfo) -> Markup:
    parts: list[object] = [tag("h2", name), metric_table(checks, profile)]
    if properties := property_table(checks):
        parts.append(properties)
    failing = [c for c in checks if c.status in FAILED]
    if failing:
        parts.append(tag("h3", f"Failing cases ({len(failing)})"))
        parts += [failing_case(c) for c in failing[:MAX_DETAILED_FAILURES]]
        if len(failing) > MAX_DETAILED_FAILURES:
            parts.append(
                _listing(
                    f"{len(failing) - MAX_DETAILED_FAILURES} more failing checks",
                    failing[MAX_DETAILED_FAILURES:],
                )
            )
    others = [c for c in checks if c.status not in FAILED]
    if others:
        counts = Counter(c.judgement for c in others)
        said = ", ".join(f"{n} {j}" for j, n in counts.items())
        parts.append(_listing(f"{len(others)} other checks: {said}", others))
    # failing checks first, so a capped pool keeps the samples that explain the failure
    sampled = [c.samples for c in failing + others if c.samples is not None]
    samples = pool_samples(sampled, MAX_PLOTTED_TOKENS)
    if len(samples):
        bounds = plots.TokenBounds.of([c.thresholds for c in failing + others])
        charts, left_out = plots.token_plots(samples, bounds)
        parts.append(tag("div", join(charts), cls="charts"))
        parts.append(
            tag(
                "p",
                f"plots: {len(samples)} tokens pooled from the {len(sampled)} checks with samples "
                f"(at most {MAX_PLOTTED_TOKENS}, failing checks first); dashed red: the bound"
                + "".join(f"; {why}" for why in left_out),
                cls="sub",
            )
        )
    return tag("section", join(parts), cls="suite", id=f"suite-{_anchor(name)}")


def metric_table(checks: list[Check], profile: ProfileInfo) -> Markup:
    """Per metric: the bound of the check whose pool the worst measured value is (with why it
    is not the profile's), that value, its fraction of the bound, the check, and a mark:
    failed, passed, or not judged (with the reason the check recorded). A property's own
    metrics are in :func:`property_table`."""
    violated = Counter(v.metric for c in checks for v in c.violations)
    worst = worst_metrics(
        {k: v for k, v in c.metrics.items() if k + BOUND_NOTE not in c.metrics} for c in checks
    )
    bounded = dict.fromkeys(m for c in checks for m in c.thresholds)
    # thresholded metrics first, in the profile's order; unthresholded ones are informational
    names = list(bounded) + [m for m in worst if m not in bounded]
    reasons = {c.name: bound_reasons(profile, c) for c in checks if c.thresholds}
    rows = []
    for metric in names:
        value = worst.get(metric)
        source = _worst_source(metric, value, checks)
        bound = source.thresholds.get(metric) if source else None
        if bound is None:
            bound = next((c.thresholds[metric] for c in checks if metric in c.thresholds), None)
        others = {c.thresholds[metric] for c in checks if metric in c.thresholds} - {bound}
        why = reasons.get(source.name, {}).get(metric) if source else None
        cell: list[object] = [] if bound is None else [f"{_sign(metric)} {as_text(bound)}"]
        if others:
            shown = ", ".join(as_text(b) for b in sorted(others)[:3])
            cell.append(tag("div", f"other checks: {shown}", cls="reason"))
        if why:
            cell.append(tag("div", why, cls="reason"))
        fraction = (
            ""
            if bound is None or value is None
            else "— (holds nothing)"
            if holds_nothing(metric, bound)
            else plots.fraction_text(fraction_of_bound(metric, value, bound))
        )
        rows.append(
            [
                tag("code", metric),
                join(cell),
                value,
                fraction,
                tag("code", source.name) if source else "",
                "" if bound is None else _judged_mark(metric, violated[metric], checks),
            ]
        )
    # long tables side by side in two halves: a suite's 18 metrics fit one screen
    halves = (
        [rows[: (len(rows) + 1) // 2], rows[(len(rows) + 1) // 2 :]] if len(rows) > 8 else [rows]
    )
    headers = ["metric", "bound", "worst measured", "of bound", "from", ""]
    pools = [
        f"{c.name}: {_pool(c)}" + (f" ({reason})" if (reason := _not_judged(c)) else "")
        for c in checks[:MAX_LISTED_CHECKS]
        if c.tokens
    ]
    notes = (
        "worst measured: a metric's worst value over the checks, each pooled over every example "
        "the check ran (a failing case below shows its own example's values); the bound is "
        "that check's, with why where it is not the profile's; of bound: how far towards it "
        "(1 = at the bound); not judged: a bound the check's verdict did not apply, for the "
        "reason given here — "
    )
    return join(
        [
            tag("div", join(table(headers, half, cls="metrics") for half in halves), cls="tables"),
            tag("p", notes + "; ".join(pools), cls="sub") if pools else "",
        ]
    )


def property_table(checks: list[Check]) -> Markup:
    """The checks held to a property's own statistic (a sampler's fidelity p-value): what it
    measured, over how many draws, and the bound its suite held it to."""
    rows = [
        [
            _check_mark(check),
            tag("code", check.name),
            tag("code", name),
            value,
            f"{_sign(name)} {as_text(bound)}",
            _drawn(check),
        ]
        for check in checks
        for name, value in check.metrics.items()
        if (bound := check.metrics.get(name + BOUND_NOTE)) is not None
    ]
    if not rows:
        return Markup("")
    return join(
        [
            tag("h3", "Properties held to their own bounds"),
            table(["", "check", "statistic", "value", "bound", "over"], rows, cls="metrics"),
        ]
    )


def _not_judged(check: Check) -> str:
    """The distinct reasons ``check`` recorded for bounds it did not apply, with how many
    metrics each."""
    reasons = Counter(check.not_judged.values())
    return "; ".join(f"{n} metric{'s' * (n != 1)} not judged: {why}" for why, n in reasons.items())


def _worst_source(metric: str, value: float | None, checks: list[Check]) -> Check | None:
    """The first check whose pooled ``metric`` is ``value`` (the worst the table shows)."""
    if value is None:
        return None
    for check in checks:
        mine = check.metrics.get(metric)
        if mine is not None and (mine == value or (math.isnan(mine) and math.isnan(value))):
            return check
    return None


def _judged_mark(metric: str, violated: int, checks: list[Check]) -> Markup:
    """Failed in some checks; else passed where judged, and not judged where a check recorded
    why (``Check.not_judged``): a metric no check judged never reads as passed."""
    measured = [c for c in checks if metric in c.metrics]
    unjudged = [c for c in measured if metric in c.not_judged]
    if violated:
        return _mark("fail", f"✘ {violated} of {len(checks)}")
    if not unjudged:
        return _mark("pass")
    reasons = "; ".join(dict.fromkeys(c.not_judged[metric] for c in unjudged))
    if len(unjudged) == len(measured):
        return tag("span", "– not judged", cls="mark skip", title=reasons)
    return join(
        [
            _mark("pass", f"✔ pass in {len(measured) - len(unjudged)} of {len(measured)}"),
            tag("span", f", not judged in {len(unjudged)}", cls="mark skip", title=reasons),
        ]
    )


def failing_case(check: Check) -> Markup:
    """One failing check: its message, violations and Hypothesis-minimal reproducer."""
    parts: list[object] = [
        tag(
            "div",
            join([_check_mark(check), " ", tag("code", check.name)]),
            cls="case-title",
        ),
        tag("p", check.message, cls="msg"),
    ]
    violations = check.violations
    if violations:
        # one wrapped line, not a table: a bf16 stack under fp32 breaks every bound at once
        items = [
            tag(
                "span",
                join(
                    [
                        tag("code", v.metric),
                        f" {as_text(v.value)} ",
                        tag("span", f"(bound {_sign(v.metric)} {as_text(v.threshold)})", cls="k"),
                    ]
                ),
                cls="pair",
            )
            for v in violations
        ]
        parts.append(
            tag(
                "div",
                join(
                    [
                        tag(
                            "span",
                            f"violated, over the check's pool of {_pool(check)}: ",
                            cls="k",
                        ),
                        *items,
                    ]
                ),
                cls="violations",
            )
        )
    shrink = check.shrink
    if shrink is not None:
        how = (
            f"shrinking cut short after {as_text(shrink.seconds)} s: the case below "
            "may not be minimal"
            if shrink.cut_short
            else f"shrunk in {as_text(shrink.seconds)} s"
        )
        parts.append(tag("p", f"{how} ({shrink.examples} examples)", cls="sub"))
    if check.worst_case is not None:
        if which := _case_values(check):
            parts.append(tag("p", which, cls="sub"))
        parts.append(reproducer(check.worst_case))
    return tag("div", join(parts), cls="case")


def _case_values(check: Check) -> str:
    """Which example the case below is, and what it measured alone (the violated metrics, else
    the headline ones): the numbers the failure message quotes, not the pool's."""
    number = check.worst_case_example
    measured = check.worst_case_metrics or {}
    names = [v.metric for v in check.violations if v.metric in measured] or [
        m for m in HEADLINE_METRICS if m in measured
    ]
    values = ", ".join(f"{m} {as_text(measured[m])}" for m in dict.fromkeys(names))
    parts = [
        f"example {number} of the {check.examples_run} the pool holds" if number else "",
        f"alone it measured {values}" if values else "",
    ]
    said = "; ".join(filter(None, parts))
    return f"the case below: {said}" if said else ""


def _pool(check: Check) -> str:
    """What a check's pooled metrics pool: ``218 tokens from 26 examples`` (files from before
    ``tokens`` say the examples only)."""
    tokens = "" if check.tokens is None else f"{check.tokens} tokens from "
    return f"{tokens}{check.examples_run} examples"


def _drawn(check: Check) -> str:
    """What a check measured over: its pool, else the tokens a property drew (noted as
    ``<property>_tokens`` beside its statistic: ``sampler_tokens`` beside ``sampler_p_value``,
    before other counts such as the support audit's), else its examples."""
    if check.tokens:
        return _pool(check)
    counts = [k for k in check.metrics if k.endswith("_tokens") and k not in BY_NAME]
    counts.sort(key=lambda k: not any(m.startswith(k[: -len("tokens")]) for m in check.held()))
    if counts:
        return f"{int(check.metrics[counts[0]])} tokens drawn ({counts[0]})"
    return f"{check.examples_run} examples" if check.examples_run else ""


def reproducer(case: Mapping[str, Any]) -> Markup:
    """The case a suite announced (its own fields: prompts, shapes, sampling, others) and the
    replay command."""
    rows: list[tuple[str, object]] = []
    prompts = list(case.get("prompt_ids") or [])
    for k, ids in enumerate(prompts[:MAX_PROMPTS]):
        ids = list(ids) if isinstance(ids, list) else [ids]
        shown = ", ".join(str(i) for i in ids[:MAX_PROMPT_IDS])
        more = f", … ({len(ids) - MAX_PROMPT_IDS} more)" if len(ids) > MAX_PROMPT_IDS else ""
        rows.append((f"prompt {k}", tag("code", f"[{shown}{more}]")))
    if len(prompts) > MAX_PROMPTS:
        rows.append(("", f"… {len(prompts) - MAX_PROMPTS} more prompts (in report.json)"))
    for key in ("batch_shape", "sampling"):
        if case.get(key) is not None:
            rows.append((key.replace("_", " "), _pairs(case[key])))
    extra = {
        k: v
        for k, v in case.items()
        if k not in ("prompt_ids", "batch_shape", "sampling", "replay")
    }
    if extra:
        rows.append(("other", _pairs(extra)))
    parts: list[object] = [table(["minimal case", ""], rows, cls="kv")]
    if case.get("replay"):
        parts += [tag("div", "replay:", cls="sub"), code_block(str(case["replay"]))]
    return join(parts)


def rl_section(summary: dict, curves: list[dict]) -> Markup:
    """The RL smoke run: summary, detector verdicts, and curves with alarm/collapse steps."""
    markers: list[tuple[float, str, str]] = []
    rows = []
    for key, label, cls in (
        ("mismatch_alarm", "alarm", "alarm"),
        ("collapse", "collapse", "collapse"),
    ):
        det = summary.get(key)
        if isinstance(det, dict):
            fired = bool(det.get("fired"))
            rows.append(
                [
                    key.replace("_", " "),
                    _mark("fail" if fired else "pass", "fired" if fired else "quiet"),
                    det.get("step"),
                    det.get("reason") or "",
                ]
            )
            if fired and isinstance(det.get("step"), int | float):
                markers.append((float(det["step"]), f"{label} @ {det['step']}", cls))
    scalars = {
        k: v for k, v in summary.items() if not isinstance(v, dict | list) and k != "curves_path"
    }
    parts: list[object] = [tag("h2", "RL smoke run")]
    if rows:
        parts.append(table(["detector", "", "step", "reason"], rows, cls="metrics"))
    if scalars:
        parts.append(table(["", ""], list(scalars.items()), cls="kv"))
    if curves:
        parts.append(tag("div", join(plots.rl_plots(curves, markers)), cls="charts"))
    return tag("section", join(parts), cls="suite", id="rl")


def _listing(title: str, checks: list[Check]) -> Markup:
    rows = [
        [_check_mark(c), tag("code", c.name), c.message, _drawn(c)]
        for c in checks[:MAX_LISTED_CHECKS]
    ]
    if len(checks) > MAX_LISTED_CHECKS:
        rows.append(["", f"… {len(checks) - MAX_LISTED_CHECKS} more in report.json", "", ""])
    return tag(
        "details",
        join(
            [
                tag("summary", title),
                table(["", "check", "message", "measured over"], rows, cls="listing"),
            ]
        ),
    )


def _sign(metric: object) -> str:
    return BY_NAME[metric].sign() if metric in BY_NAME else "≤"


def _mark(judgement: Judgement, text: str | None = None) -> Markup:
    """A judgement's mark: ✔ for a pass alone, ✘ for a failure, a dash or circle otherwise."""
    cls = judgement if judgement in ("pass", "fail") else "skip"
    return tag("span", text or JUDGEMENT_MARK[judgement], cls=f"mark {cls}")


def _check_mark(check: Check) -> Markup:
    """``check``'s judgement mark; a failure says whether it failed, errored or was cut off."""
    judgement = check.judgement
    return _mark(judgement, f"✘ {check.status}" if judgement == "fail" else None)


def _judgement_text(check: Check) -> str:
    return check.status if check.judgement == "fail" else check.judgement


def _pairs(mapping: object) -> Markup | str:
    """``key value`` pairs on one wrapped line; a nested object's pairs in parentheses."""
    if not isinstance(mapping, dict) or not mapping:
        return as_text(mapping) if mapping else ""
    return join(
        tag(
            "span",
            join(
                [
                    tag("span", k, cls="k"),
                    " ",
                    join(["(", _pairs(v), ")"]) if isinstance(v, dict) and v else as_text(v),
                ]
            ),
            cls="pair",
        )
        for k, v in mapping.items()
    )


def _anchor(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)
