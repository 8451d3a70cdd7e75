"""The parity gate on reports measured from real log-probabilities.

The baseline is an fp32 engine vs an fp32 trainer; the "kernel change" candidate rounds the
engine's logits through bfloat16, the equal candidate recomputes the baseline's stack.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from conformance.cli import main
from conformance.errors import UsageError
from conformance.gate import (
    DEFAULT_FLOOR,
    NOT_COMPARABLE,
    OK,
    REGRESSED,
    compare,
    parse_factors,
    write_gate_html,
)
from conformance.report import Report

from .reports import BF16_THRESHOLDS, make_report


@pytest.fixture(scope="module")
def baseline() -> Report:
    return make_report(torch.float32)


@pytest.fixture(scope="module")
def bf16() -> Report:
    return make_report(torch.bfloat16)


def test_equal_candidate_passes(baseline: Report) -> None:
    result = compare(baseline, make_report(torch.float32), max_regression={})
    assert result.exit_code == OK, result.reason
    assert result.rows and not any(r.regressed for r in result.rows)


def test_bf16_kernel_change_is_caught_by_profile_and_regression(
    baseline: Report, bf16: Report
) -> None:
    result = compare(baseline, bf16, max_regression={})
    assert result.exit_code == REGRESSED
    regressed = {(r.suite, r.metric) for r in result.rows if r.regressed}
    assert ("rollout_parity", "abs_diff_max") in regressed
    # pcc is a "higher is better" metric: it regresses by its shortfall from 1 growing
    assert ("rollout_parity", "pcc") in regressed
    assert result.violations and "outside profile test" in result.reason


def test_regression_within_a_loose_profile_still_fails(baseline: Report) -> None:
    candidate = make_report(torch.bfloat16, thresholds=BF16_THRESHOLDS)
    assert candidate.verdict == "pass"
    result = compare(baseline, candidate, max_regression={})
    assert result.exit_code == REGRESSED and not result.violations
    assert "regressed" in result.reason


def test_generous_factor_lets_a_known_regression_through(baseline: Report) -> None:
    candidate = make_report(torch.bfloat16, thresholds=BF16_THRESHOLDS)
    worst = max(r.ratio or 0 for r in compare(baseline, candidate, max_regression={}).rows)
    everything = {m: worst * 2 for m in candidate.checks[0].metrics}
    assert compare(baseline, candidate, max_regression=everything).exit_code == OK


def test_noise_below_the_floor_is_not_a_regression(baseline: Report) -> None:
    candidate = copy.deepcopy(baseline)
    for check in candidate.checks:
        check.metrics["abs_diff_max"] = DEFAULT_FLOOR * 0.9  # fp32 jitter, 1e-7 … 1e-6
    rows = compare(baseline, candidate, max_regression={}).rows
    row = next(r for r in rows if r.metric == "abs_diff_max")
    assert not row.regressed and row.floored


def test_a_failed_check_without_pooled_violations_counts(baseline: Report) -> None:
    candidate = copy.deepcopy(baseline)
    check = candidate.checks[0]
    check.status, check.message = "fail", "abs_diff_max = 0.3 on one token of the minimal case"
    result = compare(baseline, candidate, max_regression={})
    assert result.exit_code == REGRESSED
    assert result.violations == [f"{check.suite}/{check.name}: fail: {check.message}"]


def test_a_signed_metric_regresses_by_magnitude(baseline: Report) -> None:
    candidate = copy.deepcopy(baseline)
    for check in candidate.checks:
        check.metrics["k1"] = -1e-3 if check is candidate.checks[0] else 1e-9
    rows = compare(baseline, candidate, max_regression={}).rows
    row = next(r for r in rows if r.metric == "k1" and r.suite == candidate.checks[0].suite)
    assert row.candidate == -1e-3 and row.regressed


def test_nan_in_the_candidate_is_a_regression(baseline: Report) -> None:
    candidate = copy.deepcopy(baseline)
    candidate.checks[0].metrics["rho_std"] = float("nan")
    result = compare(baseline, candidate, max_regression={})
    assert result.exit_code == REGRESSED


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: setattr(r, "seed", 7), "different seed"),
        (lambda r: setattr(r, "examples", 99), "different examples"),
        (lambda r: r.stack["model"].update(sha256="0" * 64), "different models"),
        (lambda r: r.checks.pop(), "only the baseline ran"),
    ],
)
def test_incomparable_reports_exit_2_saying_why(baseline: Report, change, words: str) -> None:
    candidate = copy.deepcopy(baseline)
    change(candidate)
    result = compare(baseline, candidate, max_regression={})
    assert result.exit_code == NOT_COMPARABLE
    assert words in result.reason and "\n" not in result.reason


def test_incomplete_candidate_fails_and_incomplete_baseline_is_not_comparable(
    baseline: Report,
) -> None:
    broken = copy.deepcopy(baseline)
    broken.verdict, broken.reason = "incomplete", "engine died mid-run"
    broken.checks.pop()
    result = compare(baseline, broken, max_regression={})
    assert result.exit_code == REGRESSED and "engine died mid-run" in result.reason
    result = compare(broken, baseline, max_regression={})
    assert result.exit_code == NOT_COMPARABLE and "baseline run is incomplete" in result.reason


def test_bad_factors_are_usage_errors(baseline: Report) -> None:
    assert parse_factors(["abs_diff_max=3", " pcc = 1.5"]) == {"abs_diff_max": 3.0, "pcc": 1.5}
    for spec in ("abs_diff_max", "abs_diff_max=x", "=2"):
        with pytest.raises(UsageError):
            parse_factors([spec])
    with pytest.raises(UsageError, match="unknown metric"):
        compare(baseline, baseline, max_regression={"abs_dif_max": 2})
    with pytest.raises(UsageError, match="factor >= 1"):
        compare(baseline, baseline, max_regression={"abs_diff_max": 0.5})


def test_cli_prints_the_table_and_writes_html(
    tmp_path, baseline: Report, bf16: Report, capsys
) -> None:
    base, cand, equal = tmp_path / "base.json", tmp_path / "cand.json", tmp_path / "equal.json"
    base.write_text(json.dumps(baseline.to_json()))
    cand.write_text(json.dumps(bf16.to_json()))
    equal.write_text(json.dumps(make_report(torch.float32).to_json()))
    html = tmp_path / "gate.html"
    assert main(["gate", str(base), str(cand), "--html", str(html)]) == REGRESSED
    out = capsys.readouterr().out
    assert "abs_diff_max" in out and "REGRESSED" in out and "gate: FAIL" in out
    assert "GATE FAILED" in html.read_text()
    assert main(["gate", str(base), str(equal), "--max-regression", "pcc=3"]) == OK
    assert "gate: PASS" in capsys.readouterr().out


def test_cli_bad_input_is_one_line_exit_2(tmp_path, baseline: Report, capsys) -> None:
    good = tmp_path / "base.json"
    good.write_text(json.dumps(baseline.to_json()))
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "other.json").write_text('{"schema": 1}')
    for bad in ("missing.json", "text.json", "other.json"):
        assert main(["gate", str(good), str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tim-conformance: error:") and "\n" not in err
        assert str(tmp_path / bad) in err
    assert "field verdict is missing" in err


def test_gate_html_escapes_and_says_not_comparable(tmp_path, baseline: Report) -> None:
    candidate = copy.deepcopy(baseline)
    candidate.command = "<script>alert(1)</script>"
    candidate.seed = 1
    page = write_gate_html(compare(baseline, candidate, max_regression={}), tmp_path / "g.html")
    text = page.read_text()
    assert "NOT COMPARABLE" in text and "<script>" not in text and "&lt;script&gt;" in text


def test_profile_option_holds_the_candidate_to_a_shipped_profile(baseline: Report) -> None:
    loose = make_report(torch.bfloat16, thresholds=BF16_THRESHOLDS)
    factors = {m: 1e9 for m in loose.checks[0].metrics}  # isolate the profile verdict
    assert compare(baseline, loose, max_regression=factors).exit_code == OK
    result = compare(baseline, loose, profile="fp32", max_regression=factors)
    assert result.exit_code == REGRESSED and result.profile == "fp32"
    assert any("abs_diff_max" in line for line in result.violations)
    assert compare(baseline, baseline, profile="fp32", max_regression={}).exit_code == OK


def test_cli_warns_of_a_profile_table_it_ignores(tmp_path, baseline: Report, capsys) -> None:
    """An old profile's ``[suites.weight_sync]`` table no longer bounds anything: the gate
    holding a candidate to that profile says so, once, and judges by the rest."""
    base = tmp_path / "base.json"
    base.write_text(json.dumps(baseline.to_json()))
    old = tmp_path / "old.toml"
    old.write_text("abs_diff_max = 1.0\n\n[suites.weight_sync]\nabs_diff_max = 1e-9\n")
    assert main(["gate", str(base), str(base), "--profile", str(old)]) == OK
    said = capsys.readouterr().err.splitlines()
    assert [line for line in said if "[suites.weight_sync] table is ignored" in line] == [
        f"tim-conformance: warning: profile {old}: its [suites.weight_sync] table is ignored: "
        "the weight_sync suite judges the engine against itself on the new weights, under the "
        "base bounds (fix: delete the table, or calibrate the profile again)"
    ], said
