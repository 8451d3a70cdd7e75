"""Wall time of the RL smoke runs (goal: the default set under 5 min on 2 CPU cores), and of a
run in the seeds' regime (4 updates per rollout batch, engine log-probs in the ratio, bf16).

No timed assertion: pytest-benchmark records the figure (``tox -e bench``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.rl.loop import RunConfig, run_smoke, started_stack
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec

#: what ``rl-smoke`` runs with no flags, and the scenarios that start mid-run
DEFAULT_SET = ("natural", "exact", "inject", "lr-jump")


#: RL runs on one torch thread (see the fixture)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _timed_run(benchmark, spec: StackSpec, config: RunConfig, out) -> None:

    def one_run():
        with started_stack(spec) as (engine, backend):
            return run_smoke(engine, backend, config, out)

    summary = benchmark.pedantic(one_run, rounds=1, iterations=1)
    assert summary.steps == config.steps


@pytest.mark.parametrize("scenario", DEFAULT_SET)
def test_smoke_run_wall_time(benchmark, tmp_path, scenario):
    steps = RunConfig().steps
    at = steps // 2 if scenario in ("inject", "lr-jump") else 0
    _timed_run(benchmark, StackSpec(), RunConfig(scenario=Scenario(scenario, at=at)), tmp_path)


def test_seeds_regime_run_wall_time(benchmark, tmp_path):
    """``rl-smoke --updates-per-step 4 --old-logprobs engine --engine-dtype bfloat16``."""
    config = RunConfig(updates_per_step=4, old_logprobs="engine")
    _timed_run(benchmark, replace(StackSpec(), engine_dtype="bfloat16"), config, tmp_path)
