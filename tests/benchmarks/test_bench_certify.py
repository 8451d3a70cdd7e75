"""Benchmark: default ``certify`` wall time and the harness's overhead over the engine and
backend compute it triggers (goals: < 60 s on 2 cores, ≤ 5 % overhead; recorded, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_default_certify_wall_time(benchmark, tmp_path, cli_env):
    out = tmp_path / "run"

    def certify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "conformance", "certify", "--out", str(out)],
            capture_output=True, text=True, env=cli_env, timeout=1800,
        )  # fmt: skip

    result = benchmark.pedantic(certify, rounds=1, iterations=1)
    assert result.returncode == 0, result.stdout[-2000:]
    timing = json.loads((out / "report.json").read_text())["timing"]
    benchmark.extra_info.update(timing)
    print(f"\ncertify timing: {timing}")
