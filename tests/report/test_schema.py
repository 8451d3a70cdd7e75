"""report.json's typed records: a real file reads back byte for byte, early files without the
later fields still read, unknown fields are kept, and a malformed field is named in one line
with its file."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from conformance.certificate import write_certificate
from conformance.cli import main
from conformance.errors import UsageError
from conformance.gate import REGRESSED, compare
from conformance.metric_table import metric
from conformance.report import Report, load_report, render_html
from conformance.report.summary import verdict_lines

from .reports import make_report

#: a report.json as tim-conformance wrote it (``certify --suite prefill_parity --engine-dtype
#: bfloat16 --profile fp32 --examples 3 --shrink-seconds 5``), its token samples cut to 40
REAL = Path(__file__).parent / "data" / "schema1-bf16-prefill.json"
#: the fields early schema-1 files lack, per report and per check
LATER = ("depth", "timing", "fix", "scope", "run_shape", "coverage", "spec")
LATER_PER_CHECK = (
    "shrink",
    "seconds",
    "worst_case_metrics",
    "tokens",
    "not_judged",
    "worst_case_example",
    "reached",
)
LATER_PER_PROFILE = ("min_pooled_tokens", "provenance", "foreign", "suites", "max_pooled_tokens")


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def early(raw: dict) -> dict:
    """``raw`` as a schema-1 file from before the later fields."""
    data = {k: v for k, v in raw.items() if k not in LATER}
    data["checks"] = [
        {k: v for k, v in c.items() if k not in LATER_PER_CHECK} for c in raw["checks"]
    ]
    data["profile"] = {k: v for k, v in raw["profile"].items() if k not in LATER_PER_PROFILE}
    return data


def test_a_written_report_reads_back_unchanged() -> None:
    raw = json.loads(REAL.read_text())
    report = load_report(REAL)
    assert report.to_json() == raw
    (check,) = report.checks
    assert check.status == "fail" and check.shrink is not None and check.shrink.examples > 0
    assert check.violations and all(
        v.bound == metric(v.metric).bound and metric(v.metric).violates(v.value, v.threshold)
        for v in check.violations
    )
    built = make_report(torch.bfloat16)
    assert Report.from_json(json.loads(json.dumps(built.to_json()))) == built


def test_early_files_without_the_later_fields_read_with_defaults(tmp_path) -> None:
    path = write(tmp_path / "early.json", early(json.loads(REAL.read_text())))
    report = load_report(path)
    assert report.depth is None and report.timing is None and report.scope is None
    (check,) = report.checks
    assert check.shrink is None and check.seconds is None and check.worst_case_metrics is None
    assert check.not_judged == {} and check.worst_case_example is None
    # a pool of unknown size is judged, as it was when the file was written
    assert check.tokens is None and report.profile.min_pooled_tokens == 1
    assert report.to_json()["timing"] is None  # written back in the current layout


def test_gate_certificate_summary_and_page_read_early_and_current_files_alike(
    tmp_path, capsys
) -> None:
    current = REAL
    old = write(tmp_path / "early.json", early(json.loads(REAL.read_text())))
    result = compare(load_report(old), load_report(current))
    assert result.rows and all(r.baseline == r.candidate and not r.regressed for r in result.rows)
    # the run broke the fp32 profile, and says so from either file
    assert result.exit_code == REGRESSED and result.violations
    assert compare(load_report(current), load_report(old)).violations == result.violations
    assert main(["gate", str(old), str(current)]) == REGRESSED
    assert "outside profile fp32" in capsys.readouterr().out
    certificates = [
        write_certificate(path, tmp_path / f"{path.stem}-certificate.json")
        for path in (old, current)
    ]
    # the early file does not say it ran one suite: its certificate reads as the stack's, as
    # certificates did before reports recorded their scope
    assert [c.pop("scope") for c in certificates] == ["stack", "suites"]
    # nor where its profile was calibrated
    assert [c["profile"].pop("provenance") is None for c in certificates] == [True, False]
    # nor the suites whose bounds replace the base ones
    assert [bool(c["profile"].pop("suites")) for c in certificates] == [False, True]
    # nor the stack options it resolved, from which check rebuilds the stack
    assert [c.pop("spec") is None for c in certificates] == [True, False]
    assert [c.pop("stack_args") is None for c in certificates] == [True, False]
    # nor the limits it drew up to, which check holds a launch's run shape to
    assert [c.pop("run_shape") is None for c in certificates] == [True, False]
    for certificate in certificates:
        del certificate["report_sha256"]
    assert certificates[0] == certificates[1]
    assert certificates[0]["metrics"]["prefill_parity"]["abs_diff_max"] > 1e-3
    lines = [verdict_lines(load_report(path), None) for path in (old, current)]
    assert lines[0] == lines[1] and "verdict: NOT CERTIFIED" in lines[0][-2]
    # the page says how long shrinking took, where the profile was calibrated, its per-suite
    # bounds, how many tokens a check pooled, what its case measured alone and which bounds a
    # check did not judge when the file says so, and is otherwise the same
    old_page, page = (render_html(load_report(path)) for path in (old, current))
    assert "shrunk in" not in old_page and "no [provenance]" in old_page
    calibrated = r"<td>calibrated on</td><td>[^<]*</td>"
    shipped = "qwen2 60019ed3e253, qwen2 d3d40784f6d2, llama 0f1e10a4893a on cpu x86_64"
    assert shipped in re.search(calibrated, page).group()
    without = re.sub(r'<p class="sub">shrunk in [^<]*</p>', "", re.sub(calibrated, "", page))
    without = re.sub(r"<tr><td>thresholds, suite .*?</tr>", "", without)
    without = re.sub(r'\d+ tokens from |<p class="sub">the case below: [^<]*</p>', "", without)
    # the note on bounds not judged, which the early file does not record
    without = re.sub(r'<p class="sub">worst measured: [^<]*</p>', "", without)
    assert without == re.sub(calibrated, "", old_page) != page


def test_unknown_fields_are_kept(tmp_path) -> None:
    data = json.loads(json.dumps(make_report(torch.bfloat16).to_json()))
    failing = next(c for c in data["checks"] if c["violations"])
    data["rl_options"] = {"clip": 0.2}
    failing["knobs"] = {"enable_prefix_caching": True}
    failing["violations"][0]["note"] = "from a newer harness"
    data["profile"]["calibrated_on"] = "2026-11"
    data["stack"]["parallelism"] = {"world_size": 2}
    report = load_report(write(tmp_path / "newer.json", data))
    assert report.unknown == {"rl_options": {"clip": 0.2}}
    assert report.to_json() == data
    assert "NOT CERTIFIED" in render_html(report)


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        (lambda r: r.pop("verdict"), "verdict", "is missing"),
        (lambda r: r.update(verdict="passed"), "verdict", "is 'passed', not one of pass, fail"),
        (lambda r: r.update(seed=True), "seed", "is the value true, not an integer"),
        (lambda r: r.update(checks={}), "checks", "is an object, not a list"),
        (lambda r: r.update(stack=[]), "stack", "is a list, not an object"),
        (lambda r: r["stack"]["model"].pop("sha256"), "stack.model.sha256", "is missing"),
        (lambda r: r["checks"][0].update(status="ok"), "checks[0].status", "is 'ok', not one"),
        (
            lambda r: r["checks"][0]["metrics"].update(abs_diff_max="big"),
            "checks[0].metrics.abs_diff_max",
            "is the string 'big', not a number",
        ),
        (
            lambda r: r["checks"][0]["violations"][0].update(value=None),
            "checks[0].violations[0].value",
            "is null, not a number",
        ),
        (
            lambda r: r["checks"][0]["violations"][1].update(bound="above"),
            "checks[0].violations[1].bound",
            "is 'above', not one of max, min, abs",
        ),
        (
            lambda r: r["checks"][0]["shrink"].update(cut_short=1),
            "checks[0].shrink.cut_short",
            "is the value 1, not true or false",
        ),
        (
            lambda r: r["checks"][0]["samples"]["lp_train"].insert(3, "x"),
            "checks[0].samples.lp_train[3]",
            "is the string 'x', not a number",
        ),
        (lambda r: r["checks"][0].pop("nodeid"), "checks[0].nodeid", "is missing"),
        (lambda r: r["timing"].update(wall_s="1s"), "timing.wall_s", "is the string '1s'"),
    ],
)
def test_a_malformed_field_is_named_in_one_line(tmp_path, capsys, change, field, problem) -> None:
    data = copy.deepcopy(json.loads(REAL.read_text()))
    change(data)
    path = write(tmp_path / "report.json", data)
    with pytest.raises(UsageError) as error:
        load_report(path)
    assert f"{path}: field {field} {problem}" in str(error.value)
    for command in (
        ["report", str(path), "-o", str(tmp_path / "r.html")],
        ["gate", str(REAL), str(path)],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tim-conformance: error:") and "\n" not in err
        assert f"field {field} " in err and str(path) in err


def test_an_unknown_schema_says_which_it_reads(tmp_path) -> None:
    cases = (('{"schema": 2}', "schema 2"), ('{"schema": true}', "schema True"), ("[1]", "a list"))
    for content, found in cases:
        path = tmp_path / "report.json"
        path.write_text(content)
        with pytest.raises(UsageError, match=f"{found}; reads schema 1"):
            load_report(path)
