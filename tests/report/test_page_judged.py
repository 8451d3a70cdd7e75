"""The page says what it judged: a tick only for a check held to a bound, each bound that is not
the profile's with why, and one chart of every judged check's worst value as a fraction of its
bound.

The records here are real: a shipped profile's own ``bounds`` and ``unjudged`` set the
thresholds, as the session does; the browser test (``test_browser_judged.py``) loads the pages
of real certify runs.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from conformance.metric_table import metric
from conformance.profiles import load_profile
from conformance.report import render_html
from conformance.report.bounds import bound_reasons, closeness, holds_nothing
from conformance.report.schema import Check, ProfileInfo, Report
from conformance.report.stats import fraction_of_bound
from conformance.report.summary import verdict_lines

from .reports import make_report
from .test_html import Dom

SUITE = "rollout_parity"


def profile_info(name: str) -> ProfileInfo:
    return ProfileInfo.of(load_profile(name))


def judged_check(name: str, metrics: dict[str, float], tokens: int, profile: str = "fp32") -> Check:
    """A passing check's record as the session writes it, from the shipped profile's rules."""
    rules = load_profile(profile)
    bounds = rules.bounds(SUITE, tokens, metrics)
    return Check(
        suite=SUITE,
        name=name,
        nodeid=f"suites/test_{SUITE}.py::{name}",
        status="pass",
        metrics=metrics,
        tokens=tokens,
        thresholds={k: v for k, v in bounds.items() if k in metrics},
        not_judged=rules.unjudged(metrics, tokens=tokens, suite=SUITE),
        examples_run=4,
    )


def kinds() -> dict[str, Check]:
    """One check of each judgement, the way the suites record them."""
    fp32 = load_profile("fp32")
    quiet = {name: metric(name).ideal for name in fp32.thresholds}
    return {
        "pass": judged_check("test_held", dict(quiet), tokens=4096),
        # a pool below min_pooled_tokens: its pooled bounds not judged, its per-example ones are
        "small pool": judged_check("test_small", dict(quiet), tokens=3),
        "reported": Check(
            suite=SUITE,
            name="test_retokenization_drift",
            nodeid="x::test_retokenization_drift",
            status="pass",
            message="retokenization drift: 16 of 16 … (reported, not judged)",
            metrics={"retokenization_drift": 1.0},
        ),
        "not reached": Check(suite=SUITE, name="test_nothing", nodeid="x::n", status="pass"),
        "skipped": Check(suite=SUITE, name="test_skip", nodeid="x::s", status="skip"),
        "property": Check(
            suite=SUITE,
            name="test_sampled_tokens[top_p]",
            nodeid="x::test_sampled_tokens[top_p]",
            status="pass",
            metrics={
                "sampler_p_value": 0.42,
                "sampler_p_value_bound": 1.4e-4,
                "sampler_tokens": 2048.0,
            },
        ),
    }


def test_each_check_reads_as_what_it_came_to() -> None:
    checks = kinds()
    assert {k: c.judgement for k, c in checks.items()} == {
        "pass": "pass",
        "small pool": "pass",  # still held to its per-example bounds
        "reported": "reported",
        "not reached": "not reached",
        "skipped": "skipped",
        "property": "pass",
    }
    failing = copy.deepcopy(checks["pass"])
    failing.status = "error"
    assert failing.judgement == "fail"
    # a pool whose every measured bound went unjudged was held to nothing
    pooled_only = judged_check("test_pooled", {"abs_diff_mean": 1e-3, "k1": 0.0}, tokens=3)
    assert pooled_only.not_judged and pooled_only.judgement == "reported"


def rows_of(page: str, name: str) -> list[str]:
    """The text of every table row naming check ``name``."""
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    return [re.sub(r"<[^>]+>", "", row) for row in rows if f"<code>{name}</code>" in row]


def test_no_tick_on_what_was_not_held_to_a_bound() -> None:
    report = make_report(torch.float32)
    report.checks += kinds().values()
    page = render_html(report)
    for check in report.checks:
        rows = rows_of(page, check.name)
        assert rows, check.name
        ticked = any("✔" in row for row in rows)
        assert ticked == (check.judgement == "pass"), (check.name, rows)
    reported = rows_of(page, "test_retokenization_drift")
    assert any("reported, not judged" in row for row in reported)
    assert any("not reached" in row for row in rows_of(page, "test_nothing"))


def test_the_terminal_table_says_what_each_check_came_to() -> None:
    """certify's verdict table reads as the page does: PASS only for a check held to a bound."""
    report = make_report(torch.float32, checks_per_suite=1)
    report.checks += kinds().values()
    lines = verdict_lines(report, None)
    for kind, check in kinds().items():
        rows = [line.split() for line in lines if check.name in line.split()]
        if kind == "skipped":
            assert rows == [], rows  # listed under its reason, not as a row
            continue
        (row,) = rows
        assert " ".join(row[2:]).startswith(check.judgement.upper()), (kind, row)


def test_a_property_shows_its_draws_statistic_and_bound() -> None:
    report = make_report(torch.float32, checks_per_suite=1)
    report.checks.append(kinds()["property"])
    rows = rows_of(render_html(report), "test_sampled_tokens[top_p]")
    (row,) = [row for row in rows if "sampler_p_value" in row]
    for said in ("sampler_p_value", "0.42", "≥ 0.00014", "2048 tokens drawn"):
        assert said in row, row


def test_fraction_of_bound_reads_a_lower_bound_by_its_allowed_departure() -> None:
    # pcc ≥ 1 − 1e-6: a pcc of 1 − 5e-7 went half way, one of 1 − 2e-6 twice as far
    assert fraction_of_bound("pcc", 1 - 5e-7, 1 - 1e-6) == pytest.approx(0.5, rel=1e-6)
    assert fraction_of_bound("pcc", 1 - 2e-6, 1 - 1e-6) == pytest.approx(2.0, rel=1e-6)
    assert fraction_of_bound("abs_diff_max", 3e-5, 1.5e-4) == pytest.approx(0.2)
    assert fraction_of_bound("k1", -2e-7, 1e-6) == pytest.approx(0.2)  # two-sided
    assert fraction_of_bound("out_of_support_tokens", 0.0, 0.0) == 0.0
    assert fraction_of_bound("out_of_support_tokens", 1.0, 0.0) == math.inf
    assert fraction_of_bound("abs_diff_max", math.nan, 1.0) == math.inf
    assert holds_nothing("exact_match_rate", 0.0) and not holds_nothing("pcc", 0.99)


def test_a_bound_that_is_not_the_profile_s_says_why() -> None:
    info = profile_info("fp32")
    fp32 = load_profile("fp32")
    assert fp32.max_pooled_tokens is not None
    tokens = 4 * fp32.max_pooled_tokens
    quiet = {name: metric(name).ideal for name in fp32.thresholds}
    reasons = bound_reasons(info, judged_check("test_big", quiet, tokens=tokens))
    # the shipped fp32 profile's per-sequence bound sits under its per-token one
    assert fp32.thresholds["seq_log_ratio_per_sqrt_len_max"] < fp32.thresholds["abs_diff_max"]
    assert "abs_diff_max's bound" in reasons["seq_log_ratio_per_sqrt_len_max"]
    assert "grown ×2" in reasons["log_ratio_sum_per_sqrt_tokens"]
    # a spread k2 large enough that a signed mean's bound rises to its pool's noise
    noisy = quiet | {"k2": 1e-6, "k1": 0.0}
    noisy_reasons = bound_reasons(info, judged_check("test_noisy", noisy, tokens=300))
    assert "standard errors" in noisy_reasons["k1"]
    # every reason is on the page, beside its bound
    report = make_report(torch.float32, checks_per_suite=1)
    report.profile = info
    report.checks = [judged_check("test_big", quiet, tokens=tokens)]
    assert reasons["log_ratio_sum_per_sqrt_tokens"] in " ".join(Dom(render_html(report)).text)


def test_the_chart_holds_one_mark_per_judged_check() -> None:
    report = make_report(torch.bfloat16, checks_per_suite=3)
    report.checks += kinds().values()
    page = render_html(report)
    marked = re.findall(r'<g class="fb (pass|fail)" data-check="([^"]*)"', page)
    judged = [c for c in report.checks if c.judgement in ("pass", "fail")]
    assert sorted(n for _, n in marked) == sorted(c.nodeid for c in judged)
    assert all(closeness(c) is not None for c in judged)
    # sorted: the check closest to (or furthest past) its bound first
    fractions = {c.nodeid: closeness(c).fraction for c in judged}  # type: ignore[union-attr]
    assert [fractions[n] for _, n in marked] == sorted(fractions.values(), reverse=True)
    assert {s for s, n in marked if fractions[n] > 1} == {"fail"}


def test_a_pass_of_some_suites_is_not_the_certificate_banner() -> None:
    report = make_report(torch.float32)
    report.scope = "suites"
    header = re.search(r'<header class="verdict (\w+)"[^>]*>(.*?)</header>', render_html(report))
    assert header is not None
    assert header.group(1) == "scoped"
    assert "not a certificate" in header.group(2) and "CERTIFIED" not in header.group(2)


def test_engine_details_are_readable_rows_with_their_release_standing() -> None:
    report: Report = make_report(torch.float32)
    release = {
        "package": "transformers",
        "installed": "5.25.0",
        "supported": "transformers 5.17.0–5.24.0",
        "standing": "newer than tested",
    }
    report.stack["engine_info"] = {"engine": "hf-generate", "release": release}
    page = render_html(report)
    text = " ".join(Dom(page).text)
    assert "\\u" not in page and "transformers 5.17.0–5.24.0" in text
    banner = " ".join(Dom(page[: page.index("</header>")]).text)
    assert "newer than tested by engine 'hf-generate'" in banner
