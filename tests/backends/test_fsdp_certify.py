"""``tim-conformance certify --backend fsdp`` as a user runs it: a subprocess, real FSDP2 ranks.

The passing fp32 run is left to CI's suite run (``tox -e fsdp`` runs the suites against the fsdp
backend); these are the runs that must not pass: a bf16 backend under the fp32 profile, and a
rank killed mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.server_processes import all_end

pytestmark = pytest.mark.fsdp

REPO = Path(__file__).resolve().parents[2]
#: seconds a certify run may take on a loaded two-core machine
RUN_TIMEOUT_S = 900


def certify_command(out: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "conformance", "certify", "--backend", "fsdp",
        "--out", str(out), *args,
    ]  # fmt: skip


def test_bf16_backend_fails_the_fp32_profile_naming_the_metrics(tmp_path, cli_env):
    out = tmp_path / "run"
    result = subprocess.run(
        certify_command(
            out, "--backend-dtype", "bfloat16", "--engine-dtype", "float32",
            "--profile", "fp32", "--examples", "3",
            "--suite", "rollout_parity", "--suite", "parallelism_invariance",
        ),
        capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail"
    assert report["stack"]["parallelism"]["mixed_precision"] == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "float32",
    }
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert "rollout_parity" in {c["suite"] for c in failed}
    for check in failed:
        assert check["violations"], check
        # the message names the minimal failing example's metrics, each a recorded violation
        assert any(f"{v['metric']} = " in check["message"] for v in check["violations"]), check
    by_name = {c["name"]: c for c in report["checks"]}
    # world size 1 against 2, measured
    assert by_name["test_backend_parallelism_invariance"]["examples_run"] > 0


def test_a_rank_killed_mid_run_leaves_the_run_incomplete_and_no_process(tmp_path, cli_env):
    out = tmp_path / "run"
    process = subprocess.Popen(
        certify_command(out, "--examples", "5", "--suite", "parallelism_invariance",
                        "--suite", "prefill_parity", "--suite", "rollout_parity"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env, cwd=REPO,
    )  # fmt: skip
    try:
        ranks = _ranks_once_measuring(out / "results.jsonl", process)
        os.kill(ranks[-1], signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 2, stdout[-3000:] + stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "incomplete" in lines[0], stderr
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "incomplete"
    assert f"(pid {ranks[-1]}) was killed by SIGKILL" in report["reason"]
    assert "backend 'fsdp'" in report["reason"]
    assert all_end([pid for pids in _all_rank_pids(out / "results.jsonl") for pid in pids])


def _ranks_once_measuring(results: Path, process: subprocess.Popen) -> list[int]:
    """The first backend's rank pids, once the run has measured something after starting it."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"certify ended before a rank could be killed: {process.communicate()}")
        events = [json.loads(line) for line in _lines(results)]
        kinds = [e["event"] for e in events]
        if "backend_started" in kinds and "measurement" in kinds[kinds.index("backend_started") :]:
            return events[kinds.index("backend_started")]["info"]["pids"]
        time.sleep(0.2)
    pytest.fail("certify took no measurement in time")


def _all_rank_pids(results: Path) -> list[list[int]]:
    events = [json.loads(line) for line in _lines(results)]
    return [e["info"]["pids"] for e in events if e["event"] == "backend_started"]


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.endswith("}")]
    except FileNotFoundError:
        return []
