"""The smoke run end to end on the embedded stack (hf-generate → hf), several seeds each.

These are the detectors' acceptance tests from issue 6: no false alarm on ``exact`` and
``natural`` (fp32 and bf16), the alarm soon after an injected mismatch, the collapse verdict at
or shortly after the reward really drops under an LR jump.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.engines.base import Engine, EngineConfig
from conformance.errors import UsageError
from conformance.profiles import load_profile
from conformance.rl.detectors import reward_drop_step
from conformance.rl.loop import RLSummary, RunConfig, run_smoke, started_stack, sync
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec, implied_profile

SEEDS = (0, 1, 2)
#: "within a few steps": the alarm's window-3 median needs two perturbed steps, then persist 2
ALARM_DELAY_MAX = 4
#: "shortly after": the collapse rule's window-5 median needs three low steps, then persist 3
COLLAPSE_DELAY_MAX = 6


#: RL runs on one torch thread (see the fixture)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def smoke(
    tmp_path: Path, scenario: Scenario, seed: int, steps: int, engine_dtype: str = "float32"
) -> tuple[RLSummary, list[dict]]:
    profile = load_profile(implied_profile(engine_dtype, "float32"))
    config = RunConfig(scenario, steps=steps, seed=seed, profile=profile)
    with started_stack(replace(StackSpec(), engine_dtype=engine_dtype)) as (engine, backend):
        summary = run_smoke(engine, backend, config, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    assert len(rows) == steps
    assert json.loads((tmp_path / "rl-summary.json").read_text()) == summary.as_dict()
    return summary, rows


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_is_bitwise_on_policy_and_never_alarms_or_collapses(tmp_path, seed):
    summary, rows = smoke(tmp_path, Scenario("exact"), seed, steps=25)
    assert all(r["mismatch"]["exact_match_rate"] == 1.0 for r in rows)
    assert all(r["mismatch"]["rho_std"] == 0.0 for r in rows)
    assert not summary.mismatch_alarm.fired, summary.mismatch_alarm
    assert not summary.collapse.fired, summary.collapse
    assert summary.exit_code == 0


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seed", SEEDS)
def test_natural_mismatch_raises_no_false_alarm(tmp_path, seed, engine_dtype):
    summary, rows = smoke(tmp_path, Scenario("natural"), seed, steps=25, engine_dtype=engine_dtype)
    assert all(r["mismatch"]["rho_std"] > 0 for r in rows)  # the stack's own mismatch is there
    assert not summary.mismatch_alarm.fired, summary.mismatch_alarm


@pytest.mark.parametrize("seed", SEEDS)
def test_injected_mismatch_is_alarmed_within_a_few_steps(tmp_path, seed):
    at = 8
    summary, rows = smoke(tmp_path, Scenario("inject", at=at), seed, steps=at + 10)
    assert [r["injected"] > 0 for r in rows] == [step >= at for step in range(at + 10)]
    alarm = summary.mismatch_alarm
    assert alarm.fired, alarm
    assert at <= alarm.step <= at + ALARM_DELAY_MAX, alarm


@pytest.mark.parametrize("seed", SEEDS)
def test_lr_jump_collapse_is_detected_when_the_reward_drops(tmp_path, seed):
    at = 8
    summary, rows = smoke(tmp_path, Scenario("lr-jump", at=at), seed, steps=at + 22)
    assert rows[at]["lr"] == pytest.approx(Scenario("lr-jump").size * rows[at - 1]["lr"])
    drop = reward_drop_step(rows, at)
    assert drop is not None, [round(r["reward"], 3) for r in rows]
    verdict = summary.collapse
    assert verdict.fired, verdict
    assert drop <= verdict.step <= drop + COLLAPSE_DELAY_MAX, (drop, verdict)
    assert summary.exit_code == 1


def test_an_engine_that_cannot_take_weights_is_refused(tmp_path):
    class Frozen(Engine):
        """The base protocol's load_weights: this engine cannot take new weights."""

        name = "frozen"

        def generate(self, prompts, spec, *, top_logprobs=0):
            raise AssertionError("a frozen engine must be refused before sampling")

        def score(self, sequences):
            raise AssertionError("a frozen engine must be refused before scoring")

    with pytest.raises(UsageError, match="cannot take new weights"):
        sync(Frozen(EngineConfig(model=tmp_path)), {})


def test_cli_exit_codes_and_summary(tmp_path):
    from conformance.cli import main

    out = tmp_path / "run"
    code = main(["rl-smoke", "--steps", "3", "--warm-steps", "2", "--out", str(out)])
    summary = json.loads((out / "rl-summary.json").read_text())
    assert set(summary) == {
        "scenario", "remedy", "seed", "steps", "mismatch_alarm", "collapse", "lead_steps",
        "updates_per_step", "old_logprobs", "clip_low", "clip_high",
    }  # fmt: skip
    assert set(summary["collapse"]) == {"fired", "step", "reason"}
    assert code == int(summary["mismatch_alarm"]["fired"] or summary["collapse"]["fired"])
    assert main(["rl-smoke", "--steps", "0", "--out", str(tmp_path / "bad")]) == 2
    assert main(["rl-smoke", "--updates-per-step", "33", "--out", str(out)]) == 2  # > 8 × 4
    assert main(["rl-smoke", "--clip-low", "1.5", "--out", str(out)]) == 2


#: the seeds' regime (issue 13): several updates per rollout batch, engine log-probs in the ratio
SEEDS_REGIME = ["--updates-per-step", "4", "--old-logprobs", "engine", "--engine-dtype", "bfloat16"]


def _cli_run(tmp_path: Path, *args: str) -> tuple[int, dict, list[dict]]:
    from conformance.cli import main

    code = main(["rl-smoke", *args, "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "rl-summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    return code, summary, rows


def test_several_updates_with_engine_logprobs_clip_tokens(tmp_path):
    code, summary, rows = _cli_run(tmp_path, *SEEDS_REGIME, "--steps", "30")
    assert summary["updates_per_step"] == 4 and summary["old_logprobs"] == "engine"
    assert all(r["updates"] == 4 for r in rows)
    assert sum(r["clip_low"] > 0 for r in rows) > 5 and sum(r["clip_high"] > 0 for r in rows) > 5
    assert all(r["clip_fraction"] == pytest.approx(r["clip_low"] + r["clip_high"]) for r in rows)
    assert max(r["clip_seq"] for r in rows) > 0
    assert code == 0, summary


def test_exact_in_the_seeds_regime_raises_neither_detector(tmp_path):
    code, summary, rows = _cli_run(tmp_path, *SEEDS_REGIME, "--steps", "60", "--scenario", "exact")
    assert all(r["mismatch"]["rho_std"] == 0.0 for r in rows)
    assert sum(r["clip_fraction"] > 0 for r in rows) > 10  # off-policy updates still clip
    assert not summary["mismatch_alarm"]["fired"], summary
    assert not summary["collapse"]["fired"], summary
    assert code == 0


def test_one_update_with_the_recompute_never_clips(tmp_path):
    """The old default regime: ratio ≡ 1, so the clip never acts (what issue 13 found)."""
    _, _, rows = _cli_run(tmp_path, "--engine-dtype", "bfloat16", "--steps", "8")
    assert all(r["clip_fraction"] == 0 and r["ratio_kl"] == 0 for r in rows)


def test_certify_rl_smoke_takes_the_training_options(tmp_path, cli_env):
    import subprocess
    import sys

    out = tmp_path / "report"
    args = ["--rl-smoke", *SEEDS_REGIME, "--clip-high", "0.28", "--suite", "rl_smoke"]
    # one thread: two torch threads spin-wait on a loaded 2-core box (this test: 217 s vs 44 s)
    env = {**cli_env, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", *args, "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rl = json.loads((out / "report.json").read_text())["rl"]
    assert (rl["updates_per_step"], rl["old_logprobs"]) == (4, "engine")
    assert (rl["clip_low"], rl["clip_high"]) == (0.2, 0.28)
    rows = [json.loads(line) for line in (out / "rl" / "rl.jsonl").read_text().splitlines()]
    assert any(r["clip_high"] > 0 for r in rows)
    refused = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--updates-per-step", "4"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert refused.returncode == 2 and "--rl-smoke" in refused.stderr


def test_under_exact_the_two_old_policies_are_the_same_run(tmp_path):
    """ρ ≡ 1 means the engine's log-probs *are* the recompute, so one exact control serves both
    (docs/reproduction.md shares it)."""
    rows = []
    for old in ("recompute", "engine"):
        _, _, got = _cli_run(tmp_path / old, "--updates-per-step", "4", "--old-logprobs", old,
                             "--scenario", "exact", "--steps", "6")  # fmt: skip
        rows.append([{k: v for k, v in r.items() if k != "seconds"} for r in got])
    assert rows[0] == rows[1]
    assert any(r["clip_fraction"] > 0 for r in rows[0])  # off-policy updates did happen
