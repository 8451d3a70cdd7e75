"""A report says what it judged: a planted engine whose check pools fewer tokens than the
profile's ``min_pooled_tokens`` has its pooled metrics read "not judged" with the reason —
never "pass" — and each number says which example or pool it comes from.

One real run: the off-by-one engine (``tests/support/engines.py``) on the decode-vs-prefill
suite at 3 examples, on the embedded model, under fp32 (pooled bounds from 256 tokens).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.metric_table import HEADLINE_METRICS, metric
from conformance.report import load_report
from conformance.report.html import as_text, esc
from conformance.report.schema import Report
from conformance.report.summary import verdict_lines

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Report, str]:
    out = tmp_path_factory.mktemp("planted")
    # as the cli_env fixture builds it (function-scoped; this run is shared by the module)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [
            sys.executable, "-m", "conformance", "certify", "--out", str(out),
            "--engine", "tests.support.engines:OffByOne", "--suite", "decode_vs_prefill",
            "--examples", "3", "--shrink-seconds", "5",
        ],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    return load_report(out / "report.json"), (out / "report.html").read_text("utf-8")


def metric_rows(html: str) -> dict[str, str]:
    """The suite metric table's row per metric (its first cell is the metric's name)."""
    rows = re.findall(r"<tr><td><code>(\w+)</code></td>(.*?)</tr>", html)
    return dict(rows)


def test_a_small_pool_s_metrics_read_not_judged_with_why_never_pass(planted) -> None:
    report, html = planted
    (check,) = report.checks
    assert check.status == "fail" and check.tokens is not None
    assert 0 < check.tokens < report.profile.min_pooled_tokens
    pooled = {m for m in check.thresholds if metric(m).scope == "pooled"}
    assert pooled and set(check.not_judged) == pooled
    assert all(f"{check.tokens} tokens" in why for why in check.not_judged.values())
    assert not {v.metric for v in check.violations} & pooled
    # planted far outside: e.g. mean |Δlp| thousands of times its fp32 bound, and still not passed
    assert check.metrics["abs_diff_mean"] > 1000 * check.thresholds["abs_diff_mean"]

    rows = metric_rows(html)
    for name in pooled:
        assert "not judged" in rows[name] and "pass" not in rows[name], rows[name]
    for violation in check.violations:  # the per-example bounds it broke read as failed
        assert "✘" in rows[violation.metric] and "not judged" not in rows[violation.metric]
    assert esc(f"{len(pooled)} metrics not judged: {check.not_judged['k1']}") in html

    summary = "\n".join(verdict_lines(report, None))
    shown = [m for m in HEADLINE_METRICS if m in pooled]
    assert shown and all(f"{check.metrics[m]:.3g}*" in summary for m in shown)
    assert f"not judged: {check.not_judged['k1']}" in summary


def test_each_number_says_which_example_or_pool_it_comes_from(planted) -> None:
    report, html = planted
    (check,) = report.checks
    assert check.worst_case is not None and check.worst_case_metrics is not None
    assert check.worst_case_example is not None
    assert 1 <= check.worst_case_example <= check.examples_run
    # the failing example alone measured less than the pool's worst: the page says which is which
    alone, pooled = check.worst_case_metrics["abs_diff_max"], check.metrics["abs_diff_max"]
    assert alone < pooled
    assert f"{check.tokens} tokens from {check.examples_run} examples" in html
    assert f"example {check.worst_case_example} of the {check.examples_run}" in html
    assert f"abs_diff_max {as_text(alone)}" in html
    assert re.search(
        rf"{re.escape(as_text(pooled))}</td><td>[^<]*</td><td><code>{check.name}</code>",
        metric_rows(html)["abs_diff_max"],
    )
