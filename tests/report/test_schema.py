"""report.json's typed records: written and read back unchanged, schema-1 files converted,
unknown fields kept, and every malformed field named in one line with its file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from conformance.certificate import write_certificate
from conformance.cli import main
from conformance.errors import UsageError
from conformance.gate import REGRESSED, compare
from conformance.report import Report, load_report, render_html
from conformance.report.schema import SCHEMA

from .reports import make_report

#: a report.json written by tim-conformance before schema 2 (``certify --suite prefill_parity
#: --engine-dtype bfloat16 --profile fp32 --examples 3``), its token samples cut to 40 points
SCHEMA_1 = Path(__file__).parent / "data" / "schema1-bf16-prefill.json"


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def test_a_report_reads_back_as_written(tmp_path) -> None:
    report = make_report(torch.bfloat16)
    loaded = load_report(write(tmp_path / "report.json", report.to_json()))
    assert loaded == report
    assert loaded.schema == SCHEMA and loaded.to_json() == report.to_json()
    assert [v.bound for c in loaded.checks for v in c.violations]


def test_schema_1_files_are_converted_on_load() -> None:
    raw = json.loads(SCHEMA_1.read_text())
    report = load_report(SCHEMA_1)
    assert (raw["schema"], report.schema) == (1, SCHEMA)
    (check,) = report.checks
    (raw_check,) = raw["checks"]
    assert check.status == "fail" and check.shrink is not None and check.shrink.examples > 0
    # the bound a schema-1 violation carried is the metric table's, which schema 2 reads
    assert [(v.metric, v.value, v.threshold, v.bound) for v in check.violations] == [
        (v["metric"], v["value"], v["threshold"], v["bound"]) for v in raw_check["violations"]
    ]
    written = report.to_json()["checks"][0]
    assert written["violations"] and all("bound" not in v for v in written["violations"])
    assert {k: v for k, v in written.items() if k != "violations"} == {
        k: v for k, v in raw_check.items() if k != "violations"
    }


def test_early_schema_1_files_load_without_the_later_fields(tmp_path) -> None:
    raw = json.loads(SCHEMA_1.read_text())
    for key in ("depth", "timing"):
        del raw[key]
    for key in ("shrink", "seconds", "worst_case_metrics"):
        del raw["checks"][0][key]
    report = load_report(write(tmp_path / "early.json", raw))
    assert report.depth is None and report.timing is None
    assert report.checks[0].shrink is None and report.checks[0].seconds is None
    assert "NOT CERTIFIED" in render_html(report)


def test_gate_certificate_and_page_read_both_schemas_alike(tmp_path, capsys) -> None:
    old = SCHEMA_1
    new = write(tmp_path / "new.json", load_report(old).to_json())
    assert json.loads(new.read_text())["schema"] == SCHEMA
    result = compare(load_report(old), load_report(new))
    assert result.rows and all(r.baseline == r.candidate and not r.regressed for r in result.rows)
    # the run broke the fp32 profile, and says so from either file
    assert result.exit_code == REGRESSED and result.violations
    assert compare(load_report(new), load_report(old)).violations == result.violations
    assert main(["gate", str(old), str(new)]) == REGRESSED
    assert "outside profile fp32" in capsys.readouterr().out
    certificates = [
        write_certificate(path, tmp_path / f"{path.stem}-certificate.json") for path in (old, new)
    ]
    for certificate in certificates:
        del certificate["report_sha256"]
    assert certificates[0] == certificates[1]
    assert certificates[0]["metrics"]["prefill_parity"]["abs_diff_max"] > 1e-3
    assert render_html(load_report(old)) == render_html(load_report(new))


def test_unknown_fields_are_kept(tmp_path) -> None:
    data = make_report(torch.bfloat16).to_json()
    data = json.loads(json.dumps(data))
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
            lambda r: r["checks"][0]["shrink"].update(cut_short=1),
            "checks[0].shrink.cut_short",
            "is the value 1, not true or false",
        ),
        (lambda r: r["checks"][0].pop("nodeid"), "checks[0].nodeid", "is missing"),
        (lambda r: r["timing"].update(wall_s="1s"), "timing.wall_s", "is the string '1s'"),
    ],
)
def test_a_malformed_field_is_named_in_one_line(tmp_path, capsys, change, field, problem) -> None:
    raw = json.loads(SCHEMA_1.read_text())
    for data in (raw, load_report(SCHEMA_1).to_json()):  # schema 1 and schema 2
        data = copy.deepcopy(data)
        change(data)
        path = write(tmp_path / "report.json", data)
        with pytest.raises(UsageError) as error:
            load_report(path)
        assert f"{path}: field {field} {problem}" in str(error.value)
        assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tim-conformance: error:") and "\n" not in err
        assert f"field {field} " in err and str(path) in err


def test_an_unreadable_schema_says_which_it_reads(tmp_path) -> None:
    for content, found in (('{"schema": 3}', "schema 3"), ("[1]", "a list")):
        path = tmp_path / "report.json"
        path.write_text(content)
        with pytest.raises(UsageError, match=f"{found}; reads schema 1, 2"):
            load_report(path)


def test_reports_given_as_records_are_not_read_again() -> None:
    report = make_report(torch.float32)
    report.checks[0].metrics["abs_diff_max"] = 0.5
    assert render_html(report) == render_html(Report.from_json(report.to_json()))
