"""Certificates mean what they say: a run of some suites is no certificate of the stack, and
``tim-conformance check CERT`` refuses it before its stack is built, and alone checks the stack a
full run's certificate names. (A full run's certificate,
the suites it lists and the skip reasons on the terminal: ``test_certify.py``'s default run.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.certify_runs import tim_conformance

REPO = Path(__file__).resolve().parents[2]


def certify(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return tim_conformance("certify", *args, env=env)


def test_a_run_of_some_suites_is_no_certificate(tmp_path, cli_env):
    out = tmp_path / "run"
    engine = "tests.support.byoe_engines:Fp32Only"
    run = certify(
        "--engine", engine, "--suite", "rollout_parity", "--examples", "3", "--out", str(out),
        env=cli_env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "verdict: PASSED — on suite(s) rollout_parity only" in run.stdout
    assert "not a certificate of the stack" in run.stdout and "CERTIFIED" not in run.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["scope"] == "suites"
    certificate = json.loads((out / "certificate.json").read_text())
    assert certificate["verdict"] == "pass"
    assert certificate["certified"] is False and certificate["scope"] == "suites"
    assert certificate["suites"] == ["rollout_parity"]
    # refused for what it certifies, before any value of it builds a stack
    check = tim_conformance("check", str(out / "certificate.json"), env=cli_env)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "scoped to suite(s) rollout_parity" in check.stdout
    assert "the stack changed" not in check.stdout


def test_check_alone_rebuilds_the_stack_its_certificate_names(tmp_path, cli_env):
    """A full run on a non-default engine: ``--check`` with no stack options starts that
    engine, from the certificate's own values; with stack options, the stack they give."""
    out = tmp_path / "run"
    engine = "tests.support.byoe_engines:Fp32Only"
    run = certify("--engine", engine, "--examples", "1", "--out", str(out), env=cli_env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = tim_conformance("check", str(out / "certificate.json"), env=cli_env)
    assert check.returncode == 0, check.stdout + check.stderr
    other = tim_conformance(
        "check", str(out / "certificate.json"), "--engine", "hf-generate", env=cli_env
    )
    assert other.returncode == 1 and f"certified '{engine}', now 'hf-generate'" in other.stdout
