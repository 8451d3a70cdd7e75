"""Refusals and faults are one line: an engine that refuses its precision at start, and an
adapter whose answers make the harness's own code raise, each end ``incomplete`` (exit 2) with
one line naming the component, the reason and the fix; report.json is kept and the traceback is
in results.jsonl only."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from support.certify_runs import ENGINES, VARIANT_EXAMPLES

REPO = Path(__file__).resolve().parents[2]
BYOE = "tests.support.byoe_engines:"


def certify(*args: str, env: dict[str, str], out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--out", str(out), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
    )  # fmt: skip


def one_line_incomplete(out: Path, *args: str, env: dict[str, str]) -> tuple[str, dict]:
    """certify's one line and its report.json, for a run that must end ``incomplete`` (exit 2)
    without a traceback on the terminal."""
    result = certify(*args, env=env, out=out)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output and "Error in" not in output, output[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "incomplete", report["reason"]
    return line, report


def events(out: Path, kind: str) -> list[dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_an_engine_refusing_its_dtype_at_start_is_one_line_and_keeps_the_report(tmp_path, cli_env):
    out = tmp_path / "run"
    line, report = one_line_incomplete(
        out, "--engine", BYOE + "Fp32Only", "--engine-dtype", "bfloat16", env=cli_env
    )
    # the component (its name and class), the reason, and the engine's own fix
    assert "engine 'tests.support.byoe_engines:Fp32Only'" in line
    assert "(tests.support.byoe_engines.Fp32Only) refused to start" in line
    assert "no bfloat16 kernels" in line and "fix: run it with --engine-dtype float32" in line
    assert report["fix"] == "run it with --engine-dtype float32"
    (crash,) = events(out, "crash")
    assert "Traceback" in crash["traceback"] and "UsageError" in crash["traceback"]


def test_an_adapter_fault_in_harness_code_is_one_line_naming_it(tmp_path, cli_env):
    out = tmp_path / "run"
    line, report = one_line_incomplete(
        out, "--engine", BYOE + "NoneFirstLogprob", "--suite", "rollout_parity", env=cli_env
    )
    import transformers

    assert "harness/adapter fault: TypeError" in line
    # the engine release it happened with, and where the traceback is
    assert f"(transformers {transformers.__version__})" in line
    assert str(out / "results.jsonl") in line and 'event "fault"' in line
    assert "harness/adapter fault" in report["reason"]
    assert report["fix"].startswith("a harness/adapter fault: report it with its traceback")
    (fault,) = events(out, "fault")
    assert fault["nodeid"].endswith("test_rollout_parity")
    assert "Traceback" in fault["traceback"] and "TypeError" in fault["traceback"]


def test_a_harness_killed_outright_leaves_the_checks_it_finished(tmp_path, cli_env):
    """A native crash takes the process before the plugin can write its verdict: the report
    as the run stood (written as checks finish) is what stays, incomplete, and it renders."""
    out = tmp_path / "run"
    result = certify(
        "--engine", ENGINES + "SegfaultsOnWeightSync", *VARIANT_EXAMPLES,
        "--suite", "prefill_parity", "--suite", "weight_sync", env=cli_env, out=out,
    )  # fmt: skip
    assert result.returncode == -signal.SIGSEGV, (result.stdout + result.stderr)[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "incomplete", report["reason"]
    assert report["reason"].startswith("the run ended before its verdict: the harness process")
    assert "dmesg" in report["fix"]
    finished = {c["suite"] for c in report["checks"]}
    assert "prefill_parity" in finished, finished
    assert all(c["metrics"] for c in report["checks"] if c["suite"] == "prefill_parity")
    assert not (out / "certificate.json").exists()
    # pytest's fault handler logged where it died
    assert "Segmentation fault" in (out / "pytest.log").read_text()
    page = subprocess.run(
        [sys.executable, "-m", "conformance", "report", str(out / "report.json")],
        capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert page.returncode == 0, page.stderr
    # and no gate passes it: an incomplete candidate fails whatever it is compared with
    gate = subprocess.run(
        [sys.executable, "-m", "conformance", "gate", str(out / "report.json"),
         str(out / "report.json")],
        capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert gate.returncode == 1 and "candidate run is incomplete" in gate.stdout, gate.stdout


def test_a_check_killed_mid_run_keeps_what_its_examples_found(tmp_path, cli_env):
    """The check running when a native crash takes the process is in the report as it stood
    after its last example: its measurements, the bound they broke and the failing case with
    its replay command, ``interrupted`` (not judged: its failure was not yet confirmed)."""
    out = tmp_path / "run"
    result = certify(
        "--engine", ENGINES + "ReadsPastItsBuffer", *VARIANT_EXAMPLES,
        "--suite", "prefill_parity", env=cli_env, out=out,
    )  # fmt: skip
    assert result.returncode == -signal.SIGSEGV, (result.stdout + result.stderr)[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "incomplete", report["reason"]
    (check,) = report["checks"]
    assert check["suite"] == "prefill_parity" and check["status"] == "interrupted", check
    assert check["message"].startswith("running when the run ended, after "), check["message"]
    assert "an example failed: ProfileViolation" in check["message"], check["message"]
    assert check["examples_run"] >= 1 and check["metrics"]["abs_diff_max"] >= 0.25
    violation = next(v for v in check["violations"] if v["metric"] == "abs_diff_max")
    assert violation["value"] >= 0.25 > violation["threshold"], violation
    assert check["worst_case"]["prompt_ids"] and check["worst_case"]["replay"].startswith("pytest")
    assert not (out / "certificate.json").exists()
    page = subprocess.run(
        [sys.executable, "-m", "conformance", "report", str(out / "report.json")],
        capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert page.returncode == 0, page.stderr
    assert "abs_diff_max" in (out / "report.html").read_text()
