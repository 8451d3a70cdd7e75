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
import torch

from conformance.dtypes import implied_profile
from conformance.engines.base import Engine, EngineConfig
from conformance.errors import UsageError
from conformance.profiles import load_profile
from conformance.rl.calibrate import reward_drop_step
from conformance.rl.loop import RLSummary, RunConfig, build_stack, run_smoke, sync
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec

SEEDS = (0, 1, 2)
#: "within a few steps": the alarm's window-3 median needs two perturbed steps, then persist 2
ALARM_DELAY_MAX = 4
#: "shortly after": the collapse rule's window-5 median needs three low steps, then persist 3
COLLAPSE_DELAY_MAX = 6


def smoke(
    tmp_path: Path, scenario: Scenario, seed: int, steps: int, engine_dtype: str = "float32"
) -> tuple[RLSummary, list[dict]]:
    torch.set_num_threads(1)
    engine, backend = build_stack(replace(StackSpec(), engine_dtype=engine_dtype))
    try:
        profile = load_profile(implied_profile(engine_dtype, "float32"))
        config = RunConfig(scenario, steps=steps, seed=seed, profile=profile)
        summary = run_smoke(engine, backend, config, tmp_path)
    finally:
        engine.close()
        backend.close()
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
    }  # fmt: skip
    assert set(summary["collapse"]) == {"fired", "step", "reason"}
    assert code == int(summary["mismatch_alarm"]["fired"] or summary["collapse"]["fired"])
    assert main(["rl-smoke", "--steps", "0", "--out", str(tmp_path / "bad")]) == 2
    assert main(["rl-smoke", "--remedy", "gspo", "--scenario", "biased", "--out", str(out)]) == 2
