"""Certificates mean what they say: a run of some suites is no certificate of the stack, and
``certify --check CERT`` alone checks the stack the certificate names (and refuses a run of
some suites all the same). (A full run's certificate,
the suites it lists and the skip reasons on the terminal: ``test_certify.py``'s default run.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def certify(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conformance", "certify", *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
    )  # fmt: skip


def test_a_run_of_some_suites_is_no_certificate_and_check_reads_its_stack(tmp_path, cli_env):
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
    # no stack options: the certificate's own stack (a non-default engine) is the one checked,
    # and found unchanged; the gate still refuses it, as a run of some suites only
    check = certify("--check", str(out / "certificate.json"), env=cli_env)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "scoped to suite(s) rollout_parity" in check.stdout
    assert "the stack changed" not in check.stdout
    # stack options given: that stack is checked against it
    other = certify(
        "--check", str(out / "certificate.json"), "--engine", "hf-generate", env=cli_env
    )
    assert other.returncode == 1 and f"certified '{engine}', now 'hf-generate'" in other.stdout
