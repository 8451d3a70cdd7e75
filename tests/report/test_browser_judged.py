"""The pages of two real certify runs in headless Chromium: the embedded default stack
(CERTIFIED) and an engine adding 0.01 nats to every log-prob past its 16th generated token
(``ConstantBias``, NOT CERTIFIED)
on the suites that catch it, the sampler's and the retokenization drift's among them.

Each page renders without a console error; its fraction-of-bound chart holds one mark per
judged check; its visible text holds no literal escape; no check that was not held to a bound
carries a tick. Screenshots go to reports/ci-artifacts/ so CI keeps them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.report import load_report
from conformance.report.bounds import closeness
from conformance.report.schema import Report

from .chromium import BINARY, INSTALL, Chromium

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "reports" / "ci-artifacts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BINARY is None, reason=f"chromium not installed: {INSTALL}"),
]

RUNS = {
    "default": ([], 0),
    "constant-bias": (
        [
            "--engine", "tests.support.engines:ConstantBias",
            "--suite", "rollout_parity", "--suite", "sampler_fidelity", "--suite", "multi_turn",
            "--examples", "4", "--shrink-seconds", "5",
        ],
        1,
    ),
}  # fmt: skip

#: per table row: its code cells' text and the row's text (textContent: a listing folded in a
#: closed <details> has no innerText)
ROWS = """[...document.querySelectorAll('tr')].map(tr => [
  [...tr.querySelectorAll('code')].map(c => c.textContent), tr.textContent])"""


@pytest.fixture(scope="module")
def browser():
    chromium = Chromium(width=1200, height=900)
    yield chromium
    chromium.close()


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory) -> tuple[str, Report, Path]:
    name = request.param
    args, expected = RUNS[name]
    out = tmp_path_factory.mktemp(name)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--out", str(out), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=1500,
    )  # fmt: skip
    assert result.returncode == expected, result.stdout[-2000:] + result.stderr[-2000:]
    return name, load_report(out / "report.json"), out / "report.html"


def test_the_page_of_a_real_run_shows_what_it_judged(run, browser: Chromium) -> None:
    name, report, page = run
    browser.load(page)
    assert browser.console_errors() == []
    verdict = browser.evaluate("document.getElementById('verdict').innerText")
    assert verdict.startswith("CERTIFIED" if report.verdict == "pass" else "NOT CERTIFIED")

    # the chart: one mark per judged check, every one of them drawn
    judged = [c for c in report.checks if c.judgement in ("pass", "fail")]
    assert judged and all(closeness(c) is not None for c in judged)
    marks = browser.evaluate(
        "[...document.querySelectorAll('#closeness g.fb')].map(g => g.dataset.check)"
    )
    assert sorted(marks) == sorted(c.nodeid for c in judged)
    assert browser.evaluate("document.querySelectorAll('#closeness svg').length") == 1

    text = browser.evaluate("document.body.innerText")
    assert "\\u" not in text

    # no tick on a check that was not held to a bound, a tick on each that passed one
    unjudged = {c.name for c in report.checks if c.judgement not in ("pass", "fail")}
    passed = {c.name for c in report.checks if c.judgement == "pass"}
    rows = browser.evaluate(ROWS)
    for check in unjudged:
        named = [row for codes, row in rows if check in codes]
        assert named and not any("✔" in row for row in named), (check, named)
    for check in passed:
        assert any(check in codes and "✔" in row for codes, row in rows), check
    by_name = {c.name: c.judgement for c in report.checks}
    assert by_name["test_retokenization_drift"] == "reported"
    sampler = [c for c in report.checks if c.suite == "sampler_fidelity" and c.judgement == "pass"]
    assert sampler and all("sampler_p_value_bound" in c.metrics for c in sampler)
    assert browser.screenshot(ARTIFACTS / f"report-{name}.png").stat().st_size > 10_000
