"""The from-scratch engine of docs/adding-an-engine.md, run from the page: certify certifies it,
it refuses the precision it lacks in one line, and the artefacts it declares are part of the
fingerprint a certificate pins."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.certify_runs import tim_conformance

from conformance.fingerprint import stack_fingerprint

REPO = Path(__file__).resolve().parents[2]
ENGINE = "tests.support.doc_engine:LoopEngine"


def certify(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return tim_conformance("certify", "--engine", ENGINE, *args, env=env, timeout=1200)


def check(certificate: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return tim_conformance("check", str(certificate), "--engine", ENGINE, env=env)


def test_the_docs_engine_from_scratch_is_certified_and_pins_its_artefacts(tmp_path, cli_env):
    out = tmp_path / "run"
    # one example a property, in batches of 8: the page's engine samples one prompt a token
    # at a time in Python, where the top-size batch of 32 was most of this test
    run = certify("--examples", "1", "--max-batch", "8", "--out", str(out), env=cli_env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass"
    measured = {c["suite"] for c in report["checks"] if c["status"] == "pass"}
    assert {"rollout_parity", "determinism", "weight_sync", "decode_vs_prefill"} <= measured
    artefacts = report["stack"]["engine_info"]["artefacts"]
    assert len(artefacts["weights_sha256"]) == 64
    # the certificate pins the artefact: the same stack checks clean, a changed digest does not
    cert = out / "certificate.json"
    same = check(cert, env=cli_env)
    assert same.returncode == 0, same.stdout + same.stderr
    # a certificate of the stack with other weights: the digest and the fingerprint over it,
    # moved away from the report (which would show them edited)
    certificate = json.loads(cert.read_text())
    certificate["stack"]["engine_info"]["artefacts"]["weights_sha256"] = "0" * 64
    certificate["fingerprint"] = stack_fingerprint(certificate["stack"])
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(certificate))
    differs = check(changed, env=cli_env)
    assert differs.returncode == 1 and "engine_info.artefacts.weights_sha256" in differs.stdout


def test_the_docs_engine_refuses_float16_in_one_line(tmp_path, cli_env):
    out = tmp_path / "run"
    run = certify("--engine-dtype", "fp16", "--out", str(out), env=cli_env)
    assert run.returncode == 2 and "Traceback" not in run.stdout + run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert (
        "(tests.support.doc_engine.LoopEngine) refused to start: loop has no float16 path" in line
    )
    assert "fix: run it with --engine-dtype float32" in line
    assert json.loads((out / "report.json").read_text())["verdict"] == "incomplete"
