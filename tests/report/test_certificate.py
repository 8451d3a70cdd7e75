"""certificate.json: written from a real report, checked against the current stack."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

from conformance.certificate import (
    compare_stacks,
    compare_values,
    judge_certificate,
    load_certificate,
    write_certificate,
)
from conformance.depth import depth
from conformance.errors import UsageError
from conformance.report import Report
from conformance.stack import StackSpec

from .reports import SUITES, make_report


@pytest.fixture
def written(tmp_path) -> tuple[Report, dict, object]:
    report = make_report(torch.bfloat16)
    report_path = tmp_path / "report.json"
    report_path.write_text(json.dumps(report.to_json()))
    cert_path = tmp_path / "certificate.json"
    return report, write_certificate(report_path, cert_path), cert_path


def test_certificate_summarises_the_report(written, tmp_path) -> None:
    report, cert, cert_path = written
    assert json.loads(cert_path.read_text()) == cert
    assert (
        cert["report_sha256"] == hashlib.sha256((tmp_path / "report.json").read_bytes()).hexdigest()
    )
    assert cert["verdict"] == report.verdict == "fail" and cert["certified"] is False
    assert cert["profile"]["name"] == "test"
    assert set(cert["metrics"]) == set(SUITES)
    for suite in SUITES:
        checks = [c for c in report.checks if c.suite == suite]
        assert cert["metrics"][suite]["abs_diff_max"] == max(
            c.metrics["abs_diff_max"] for c in checks
        )
        assert cert["metrics"][suite]["pcc"] == min(c.metrics["pcc"] for c in checks)
    assert "path" not in cert["stack"]["model"]


def test_same_stack_matches_even_from_another_folder(written) -> None:
    report, _, cert_path = written
    stack = copy.deepcopy(report.stack)
    stack["model"]["path"] = "/elsewhere/model"
    stack["fingerprint"] = "recomputed"
    check = compare_stacks(load_certificate(cert_path), stack)
    assert check.matches and check.differences == []


def test_changed_stack_lists_each_difference(written) -> None:
    report, _, cert_path = written
    stack = copy.deepcopy(report.stack)
    stack["engine_dtype"] = "float32"
    stack["versions"]["torch"] = "9.9.9"
    stack["env"]["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    check = compare_stacks(load_certificate(cert_path), stack)
    assert not check.matches
    assert check.differences == [
        ("engine_dtype", "bfloat16", "float32"),
        ("env.CUBLAS_WORKSPACE_CONFIG", None, ":4096:8"),
        ("versions.torch", torch.__version__, "9.9.9"),
    ]


def test_a_certificate_is_judged_alone_then_with_the_stack(written) -> None:
    """A NOT CERTIFIED run's certificate is refused on its own, no stack compared; holding
    the current stack to it adds its differences after."""
    report, cert, cert_path = written
    standing = judge_certificate(cert, path=cert_path)
    assert standing.reasons[0] == "its run was not certified: verdict NOT CERTIFIED"
    assert standing.stack is None and not standing.certifies
    stack = copy.deepcopy(report.stack)
    stack["engine_dtype"] = "float32"
    verdict = standing.with_stack(
        compare_stacks(cert, stack), compare_values(cert, StackSpec(), stack)
    )
    assert verdict.reasons == [
        *standing.reasons,
        "the stack changed since it was certified: engine_dtype",
    ]
    assert "  engine_dtype: certified 'bfloat16', now 'float32'" in verdict.lines


def test_a_launch_is_held_to_the_values_it_names(written) -> None:
    """Of the options a run is judged at, the ones a launch names are held to the certified
    values (the run shape by its limits, the profile by its bounds, the rest by the spec); the
    ones it leaves unnamed are not; a certificate that records none (written before the
    field) certifies none."""
    _, cert, cert_path = written
    cert = {**cert, "spec": StackSpec().option_values(), "run_shape": depth("quick").run_shape()}
    launch = StackSpec.from_options(
        {"tim_max_new_tokens": "1000", "tim_examples": "20", "tim_shrink_seconds": "30"}
    )
    started = copy.deepcopy(cert["stack"])
    values = compare_values(cert, launch, started)
    # 20 examples is what the certified run drew: named, and the same
    drawn = depth("quick").max_new_tokens
    assert values.differences == [
        ("run_shape.max_new_tokens", drawn, 1000),
        ("spec.shrink-seconds", "60", "30"),
    ]
    verdict = judge_certificate(cert, path=cert_path).with_stack(
        compare_stacks(cert, started), values
    )
    assert verdict.reasons[-1] == (
        "the launch's values differ from the certified ones: run_shape.max_new_tokens, "
        "spec.shrink-seconds"
    )
    assert f"  run_shape.max_new_tokens: certified {drawn}, now 1000" in verdict.lines
    # the same values, unnamed (a spec built in Python names none): nothing to hold
    assert compare_values(cert, StackSpec(examples=500, shrink_seconds=30), started).matches
    # the profile by its bounds: the shipped bf16's are not the ones the run was judged by
    bf16 = StackSpec.from_options({"tim_profile": "bf16"})
    (named,) = compare_values(cert, bf16, started).differences
    assert named == ("profile", "test", "bf16")
    # the engine's options, named or not, that the started engine does not report (an
    # engine on the protocol's own info reports none); one it reports is the fingerprint's to
    # hold, by its value in effect; a server's address is where it runs
    asked = StackSpec.from_options({"tim_engine_option": ["max_batch=8"]})
    assert compare_values(cert, asked, started).differences == [
        ("spec.engine-option", [], ["max_batch=8"])
    ]
    knobs = {**started, "engine_info": {"engine": "vllm", "knobs": {"max_batch": 8}}}
    assert compare_values(cert, asked, knobs).matches
    served = {**cert, "spec": {**cert["spec"], "engine-option": ["url=http://10.0.0.1:8000"]}}
    url = StackSpec.from_options({"tim_engine_url": "http://h:1"})
    assert compare_values(served, url, started).matches
    older = {k: v for k, v in cert.items() if k != "run_shape"}
    assert compare_values(older, launch, started).differences[0] == (
        "run_shape.max_new_tokens",
        "not recorded",
        1000,
    )


def test_bad_inputs_are_one_line_errors(tmp_path) -> None:
    (tmp_path / "r.json").write_text("[]")
    (tmp_path / "c.json").write_text('{"stack": {}}')
    with pytest.raises(UsageError):
        write_certificate(tmp_path / "r.json", tmp_path / "out.json")
    with pytest.raises(UsageError):
        write_certificate(tmp_path / "none.json", tmp_path / "out.json")
    for bad in ("c.json", "none.json", "r.json"):
        with pytest.raises(UsageError) as err:
            load_certificate(tmp_path / bad)
        assert "\n" not in str(err.value)
