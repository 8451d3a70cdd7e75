"""Wall time of the RL smoke runs (goal: the default set under 5 min on 2 CPU cores).

No timed assertion: pytest-benchmark records the figure (``tox -e bench``).
"""

from __future__ import annotations

import pytest
import torch

from conformance.rl.loop import RunConfig, build_stack, run_smoke
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec

#: what ``rl-smoke`` runs with no flags, and the scenarios that start mid-run
DEFAULT_SET = ("natural", "exact", "inject", "lr-jump")


@pytest.mark.parametrize("scenario", DEFAULT_SET)
def test_smoke_run_wall_time(benchmark, tmp_path, scenario):
    torch.set_num_threads(1)
    steps = RunConfig().steps
    at = steps // 2 if scenario in ("inject", "lr-jump") else 0
    config = RunConfig(scenario=Scenario(scenario, at=at))

    def one_run():
        engine, backend = build_stack(StackSpec())
        try:
            return run_smoke(engine, backend, config, tmp_path / scenario)
        finally:
            engine.close()
            backend.close()

    summary = benchmark.pedantic(one_run, rounds=1, iterations=1)
    assert summary.steps == steps
