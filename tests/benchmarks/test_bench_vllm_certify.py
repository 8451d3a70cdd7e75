"""Benchmark: ``certify --engine vllm`` wall time per standalone vLLM start on the same machine
(issue goal: at most 2.2), and the part of it no suite removes: the process's own start and the
engine starts (the stack's engine and the knob suite's three variants, booked in the report as
``engine_start_s``). ``--examples 1`` is the least work a run can do. Recorded in
``extra_info``, never asserted. Run it where vLLM is installed:

    .tox/vllm/bin/python -m pytest tests/benchmarks/test_bench_vllm_certify.py --benchmark-only
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.models.cache import default_model

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs vLLM: run it in .tox/vllm"
    ),
]

#: one start of the engine certify starts first, in a fresh process, as a user's script would
STANDALONE_START = """
from conformance.engines import EngineConfig
from conformance.engines.vllm import VLLMEngine
VLLMEngine(EngineConfig(model={model!r})).close()
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=3600)
    return time.perf_counter() - start, result


@pytest.fixture(scope="module")
def standalone_start_s() -> float:
    """Median wall time of three standalone starts (the model is built before the first)."""
    code = STANDALONE_START.format(model=str(default_model()))
    walls = []
    for _ in range(3):
        wall, result = _timed([sys.executable, "-c", code])
        assert result.returncode == 0, result.stderr[-2000:]
        walls.append(wall)
    return statistics.median(walls)


@pytest.mark.parametrize("examples", [1, 20])
def test_vllm_certify_per_standalone_start(benchmark, tmp_path, standalone_start_s, examples):
    out = tmp_path / "run"
    walls: list[float] = []

    def certify() -> subprocess.CompletedProcess[str]:
        wall, result = _timed(
            [sys.executable, "-m", "conformance", "certify", "--engine", "vllm",
             "--examples", str(examples), "--out", str(out)]
        )  # fmt: skip
        walls.append(wall)
        return result

    result = benchmark.pedantic(certify, rounds=1, iterations=1)
    assert result.returncode == 0, result.stdout[-2000:]
    timing = json.loads((out / "report.json").read_text())["timing"]
    events = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    starts = sum(event["event"] == "engine_started" for event in events)
    (wall,) = walls
    # starts, the process's own start and the harness: all but the engine and backend computing
    fixed = wall - timing["engine_s"] - timing["backend_s"]
    benchmark.extra_info.update(
        timing,
        certify_wall_s=round(wall, 3),
        standalone_start_s=round(standalone_start_s, 3),
        engine_starts=starts,
        per_start=round(wall / standalone_start_s, 2),
        all_but_compute_per_start=round(fixed / standalone_start_s, 2),
    )
    print(f"\ncertify --engine vllm --examples {examples}: {benchmark.extra_info}")
