"""The report in a real browser: headless Chromium (Debian's ``chromium`` package).

Screenshots go to reports/ci-artifacts/ so CI can keep them.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import torch

from conformance.report import Report, write_html

from .chromium import BINARY, INSTALL, Chromium
from .reports import SUITES, make_report

pytestmark = pytest.mark.skipif(BINARY is None, reason=f"chromium not installed: {INSTALL}")

ARTIFACTS = Path(__file__).resolve().parents[2] / "reports" / "ci-artifacts"
MAX_BYTES = 5 * 1024 * 1024
LARGE_CASES = 10_000

VISIBLE = """(sel => [...document.querySelectorAll(sel)].map(el => {
  const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  return r.width > 0 && r.height > 0 && s.visibility === 'visible' && s.display !== 'none';
}))"""


@pytest.fixture(scope="module")
def browser():
    chromium = Chromium()
    yield chromium
    chromium.close()


def test_report_is_visible_and_quiet_in_chromium(tmp_path, browser: Chromium) -> None:
    report = make_report(torch.bfloat16)
    report.checks[
        1
    ].message = '"><img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    report.rl = {"mismatch_alarm": {"fired": True, "step": 20, "reason": "rho_std 3x"}}
    curves = [{"step": s, "reward": s / 50, "rho_std": 1e-3 * 1.05**s} for s in range(50)]
    page = write_html(report, tmp_path / "report.html", rl_curves=curves)
    browser.load(page)

    assert browser.evaluate(f"{VISIBLE}('#verdict')") == [True]
    assert browser.evaluate("document.getElementById('verdict').innerText").startswith(
        "NOT CERTIFIED"
    )
    for suite in SUITES:
        visible = browser.evaluate(f"{VISIBLE}('#suite-{suite} table.metrics')")
        assert visible and all(visible)
        rows = browser.evaluate(
            f"document.querySelectorAll('#suite-{suite} table.metrics tbody tr').length"
        )
        assert rows >= 3
    assert browser.evaluate("document.scripts.length + document.images.length") == 0
    assert browser.evaluate("typeof window.pwned") == "undefined"
    assert browser.console_errors() == []
    assert browser.screenshot(ARTIFACTS / "report.png").stat().st_size > 10_000


def large_report() -> Report:
    """10 000 checks: a few measured reports' checks, repeated under distinct names."""
    pool = make_report(torch.bfloat16, checks_per_suite=8).checks
    pool += make_report(torch.float32, checks_per_suite=8).checks
    report = make_report(torch.bfloat16, checks_per_suite=1)
    checks = []
    for i in range(LARGE_CASES):
        check = copy.deepcopy(pool[i % len(pool)])
        check.suite = f"suite_{i % 6}"
        check.name = f"test_case[{i}]"
        check.nodeid = f"suites/test_{check.suite}.py::test_case[{i}]"
        checks.append(check)
    report.checks = checks
    return report


@pytest.mark.slow
def test_ten_thousand_cases_stay_small_and_render(tmp_path, browser: Chromium, benchmark) -> None:
    report = large_report()
    (tmp_path / "report.json").write_text(json.dumps(report.to_json()))
    start = time.perf_counter()
    page = write_html(report, tmp_path / "report.html")
    write_s = time.perf_counter() - start
    size = page.stat().st_size
    assert size < MAX_BYTES, f"{size} bytes"

    def render() -> float:
        browser.load(page)
        return browser.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")

    load_ms = benchmark.pedantic(render, rounds=3, iterations=1)
    assert browser.evaluate("document.getElementById('verdict').innerText").startswith(
        "NOT CERTIFIED"
    )
    assert browser.console_errors() == []
    benchmark.extra_info.update(
        cases=LARGE_CASES,
        html_bytes=size,
        report_json_bytes=(tmp_path / "report.json").stat().st_size,
        write_html_s=round(write_s, 2),
        load_event_ms=load_ms,
    )
    print(
        f"\n{LARGE_CASES} cases: report.html {size / 1e6:.2f} MB (report.json "
        f"{benchmark.extra_info['report_json_bytes'] / 1e6:.1f} MB), write_html {write_s:.2f} s, "
        f"Chromium load event {load_ms:.0f} ms"
    )
