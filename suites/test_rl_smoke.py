"""RL smoke run on the stack under test (opt-in: ``--tim-rl-smoke``, ``certify --rl-smoke``).

A short GRPO run on the session's stack definition — a fresh engine and backend built from it,
since training changes their weights — with the natural (the stack's own) mismatch: neither the
mismatch alarm nor the collapse detector may fire. The training regime follows
``--tim-updates-per-step``, ``--tim-old-logprobs``, ``--tim-clip-low`` and ``--tim-clip-high``
(``certify --rl-smoke --updates-per-step 4 ...``).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.rl

#: long enough for the detectors' baselines and windows, short enough for a suite
SUITE_STEPS = 40


def test_rl_smoke_natural(tim, recorder, rl_summary, tmp_path, request):
    if not request.config.getoption("tim_rl_smoke"):
        pytest.skip("opt-in: --tim-rl-smoke (trains a copy of the stack for a few minutes)")

    from conformance.rl.loop import RunConfig, run_smoke, started_stack
    from conformance.rl.options import training_values

    out = tim.report_dir / "rl" if tim.report_dir is not None else tmp_path
    regime = training_values(vars(request.config.option))
    config = RunConfig(steps=SUITE_STEPS, profile=tim.profile, **regime)
    with started_stack(tim.spec) as (engine, backend):
        summary = run_smoke(engine, backend, config, out)
    if tim.report_dir is not None:
        rl_summary({**summary.as_dict(), "curves_path": "rl/rl.jsonl"})
    rows = [json.loads(line) for line in (out / "rl.jsonl").read_text().splitlines()]
    recorder.note(
        rl_steps=float(len(rows)),
        rl_reward_first=rows[0]["reward"],
        rl_reward_last=rows[-1]["reward"],
        rl_rho_std_max=max(r["mismatch"]["rho_std"] for r in rows),
    )
    verdicts = summary.as_dict()
    assert not summary.mismatch_alarm.fired, f"mismatch alarm: {verdicts['mismatch_alarm']}"
    assert not summary.collapse.fired, f"collapse: {verdicts['collapse']}"
