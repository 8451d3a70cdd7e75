"""The detectors' record: every rule on every scenario and seed, written as one markdown file.

``python tools/rl_detector_record.py --out docs/rl-detectors.md`` reruns the measured runs and
regenerates the record (true / false positives, detection delay, margins of the healthy runs).
With ``--runs-dir DIR`` the runs are kept, and finished ones are reused: after a rule changes,
the same command redraws the record without rerunning.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from conformance.profiles import load_profile
from conformance.rl.detectors import (
    DROP_FRACTION,
    DROP_SPAN,
    STD_RHO,
    CollapseRules,
    Firing,
    MismatchRules,
    collapse_firings,
    mismatch_firings,
    mismatch_value,
    reward_drop_step,
    rolling_median,
)
from conformance.rl.loop import RunConfig, run_smoke, started_stack
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec, implied_profile

#: the training regimes every case runs in: rl-smoke's default (one update per rollout batch,
#: recomputed old policy) and the seeds' (issue 13: 4 updates, the engine's log-probs as the old
#: policy), as ``RunConfig`` fields
REGIMES: dict[str, dict[str, Any]] = {
    "k1": {},
    "k4e": {"updates_per_step": 4, "old_logprobs": "engine"},
    # the positive control's: docs/reproduction.md's regime at lr 5e-4
    "repro-lr5e-4": {
        "updates_per_step": 4,
        "old_logprobs": "engine",
        "prompts": 4,
        "group": 8,
        "lr": 5e-4,
    },
}
#: the regimes every scenario runs in
SCENARIO_REGIMES = ("k1", "k4e")


@dataclass(frozen=True)
class Case:
    """A scenario on a stack, and what each verdict should say (None: not judged)."""

    label: str
    engine_dtype: str
    scenario: Scenario
    alarm_expected: bool | None
    collapse_expected: bool | None
    regime: str = "k1"

    @property
    def name(self) -> str:
        return f"{self.label}-{self.regime}"


def cases(steps: int) -> list[Case]:
    mid = steps // 2
    base = [
        Case("exact", "float32", Scenario("exact"), False, False),
        Case("exact-bf16-sampling", "bfloat16", Scenario("exact"), False, False),
        Case("natural-fp32", "float32", Scenario("natural"), False, False),
        Case("natural-bf16", "bfloat16", Scenario("natural"), False, False),
        Case("unbiased", "float32", Scenario("unbiased"), False, None),
        Case("biased", "float32", Scenario("biased"), None, None),
        Case("inject", "float32", Scenario("inject", at=mid), True, None),
        Case("lr-jump", "float32", Scenario("lr-jump", at=mid), None, True),
    ]
    # the positive control for the collapse detector (issue 13): the one setting found where
    # the mismatch, not the learning rate, collapsed a run (injected std ρ ≈ 0.1 from the start
    # collapsed one seed in three; the exact control, same seeds, none)
    injected = Scenario("inject", strength=0.1)
    control = [
        Case("exact", "float32", Scenario("exact"), False, False, "repro-lr5e-4"),
        Case("mismatch-collapse", "float32", injected, True, None, "repro-lr5e-4"),
    ]
    return [replace(c, regime=r) for r in SCENARIO_REGIMES for c in base] + control


@dataclass
class RunRecord:
    case: Case
    seed: int
    alarm: list[Firing]
    collapse: list[Firing]
    drop_step: int | None
    seconds: float
    margins: dict[str, float]


def margins(rows: Sequence[dict[str, Any]], rules: MismatchRules) -> dict[str, float]:
    """How close a run came to each threshold: peaks of the smoothed signals."""
    std = rolling_median([mismatch_value(r, STD_RHO) for r in rows], rules.window)
    base = statistics.median(std[: rules.baseline_steps])
    reward = rolling_median([float(r["reward"]) for r in rows], CollapseRules().window)
    peak = [max(reward[: i + 1]) for i in range(len(reward))]
    return {
        "max std ρ": max(std),
        "max growth": max(s / base for s in std[rules.baseline_steps :]) if base > 0 else 0.0,
        "min PCC": min(mismatch_value(r, "pcc") for r in rows),
        "max outside": max(float(r["rho_outside_frac"]) for r in rows),
        "min reward/peak": min(r / p for r, p in zip(reward, peak, strict=True) if p > 0),
    }


def _complete(out: Path, steps: int) -> bool:
    """A finished run of ``steps`` steps is already there (so the record can be redrawn)."""
    path = out / "rl-summary.json"
    return path.is_file() and json.loads(path.read_text())["steps"] == steps


def measure(case: Case, seed: int, steps: int, runs_dir: Path) -> RunRecord:
    spec = replace(StackSpec(), engine_dtype=case.engine_dtype)
    profile = load_profile(implied_profile(case.engine_dtype, spec.backend_dtype))
    config = RunConfig(
        scenario=case.scenario, steps=steps, seed=seed, profile=profile, **REGIMES[case.regime]
    )
    out = runs_dir / f"{case.name}-s{seed}"
    if not _complete(out, steps):
        with started_stack(spec) as (engine, backend):
            run_smoke(engine, backend, config, out)
    rows = [json.loads(line) for line in (out / "rl.jsonl").read_text().splitlines()]
    return RunRecord(
        case=case,
        seed=seed,
        alarm=mismatch_firings(rows, config.mismatch_rules, profile),
        collapse=collapse_firings(rows, config.collapse_rules),
        drop_step=reward_drop_step(rows, case.scenario.at) if case.collapse_expected else None,
        seconds=sum(r["seconds"] for r in rows),
        margins=margins(rows, config.mismatch_rules),
    )


def judge(firings: list[Firing], expected: bool | None, start: int | None) -> str:
    """TP / FP / TN / FN for one verdict; a firing before ``start`` is a false positive."""
    first = min((f.step for f in firings), default=None)
    if expected is None:
        return "—" if first is None else f"fired@{first}"
    if first is None:
        return "FN" if expected else "TN"
    if not expected or (start is not None and first < start):
        return f"FP@{first}"
    return f"TP@{first}"


def first_step(firings: list[Firing]) -> int | None:
    return min((f.step for f in firings), default=None)


def totals(records: list[RunRecord]) -> list[str]:
    """The record in four lines: false alarms, false collapses, what was caught and how soon."""

    def delays(pairs: list[tuple[int | None, int | None]]) -> str:
        found = [fired - ref for fired, ref in pairs if fired is not None and ref is not None]
        caught = sum(fired is not None for fired, _ in pairs)
        span = f", {min(found)}–{max(found)} steps after" if found else ""
        return f"{caught}/{len(pairs)}{span}"

    quiet_alarm = [r for r in records if r.case.alarm_expected is False]
    quiet_crash = [r for r in records if r.case.collapse_expected is False]
    injected = [r for r in records if r.case.alarm_expected]
    crashed = [r for r in records if r.case.collapse_expected]
    broken = [r for r in injected if r.alarm and r.collapse]
    leads = [first_step(r.collapse) - first_step(r.alarm) for r in broken]  # both fired
    return [
        f"- Mismatch alarm on runs that must stay quiet: {sum(bool(r.alarm) for r in quiet_alarm)}"
        f" false alarms in {len(quiet_alarm)} runs.",
        f"- Collapse detector on runs that must not collapse: "
        f"{sum(bool(r.collapse) for r in quiet_crash)} false collapses in {len(quiet_crash)} runs.",
        "- Injected mismatch caught: "
        + delays([(first_step(r.alarm), r.case.scenario.at) for r in injected])
        + " the injection starts.",
        "- Collapse caught: "
        + delays([(first_step(r.collapse), r.drop_step) for r in crashed])
        + " the reward actually dropped.",
        f"- Runs an injected mismatch collapsed: {len(broken)} of {len(injected)}"
        + (
            "; the mismatch alarm fired "
            + ", ".join(str(lead) for lead in leads)
            + " steps before the collapse detector."
            if broken
            else "."
        ),
    ]


def render(records: list[RunRecord], steps: int) -> str:
    mrules, crules = MismatchRules(), CollapseRules()
    lines = [
        "# RL smoke detectors: the measured record",
        "",
        "Generated by `python tools/rl_detector_record.py --out docs/rl-detectors.md` "
        f"({len(records)} runs of {steps} steps, embedded model, hf-generate → hf, "
        f"{sum(r.seconds for r in records) / 60:.1f} min of RL steps on a 2-core CPU). "
        "Do not edit by hand.",
        "",
        f"Mismatch rules: `{mrules}`, plus the `profile` rule: the stack's implied tolerance "
        "profile (fp32 for an fp32 engine, bf16 for a bf16 one) violated `persist` steps in a row.",
        "",
        f"Collapse rules: `{crules}`.",
        "",
        "Regimes (the case name's suffix): "
        + "; ".join(
            f"`{k}` = {v or 'rl-smoke defaults (1 update, recomputed old policy)'}"
            for k, v in REGIMES.items()
        )
        + ". `exact-bf16-sampling` replaces a bf16 engine's log-probs by the trainer's: ρ ≡ 1 "
        "while the tokens are still sampled in bf16.",
        "",
        *totals(records),
        "",
        "Verdicts: TP/FP/TN/FN against the case's expectation (— and fired@ = not judged). "
        "An alarm before `at` in `inject` is a false positive. For `lr-jump`, `drop` is the "
        "hindsight step at which the reward actually fell (mean of the next "
        f"{DROP_SPAN} rewards below {DROP_FRACTION:g}× the mean of the {DROP_SPAN} before `at`).",
        "",
        "| case | seed | at | alarm | alarm rules (step) | collapse | collapse rules (step) "
        "| drop | lead | step s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        at = r.case.scenario.at if r.case.scenario.name in ("inject", "lr-jump") else None
        alarm_first = first_step(r.alarm)
        crash_first = first_step(r.collapse)
        lead = crash_first - alarm_first if None not in (alarm_first, crash_first) else None
        lines.append(
            f"| {r.case.name} | {r.seed} | {'' if at is None else at} "
            f"| {judge(r.alarm, r.case.alarm_expected, at)} "
            f"| {', '.join(f'{f.rule} ({f.step})' for f in r.alarm) or '—'} "
            f"| {judge(r.collapse, r.case.collapse_expected, at)} "
            f"| {', '.join(f'{f.rule} ({f.step})' for f in r.collapse) or '—'} "
            f"| {'' if r.drop_step is None else r.drop_step} | {'' if lead is None else lead} "
            f"| {r.seconds:.0f} |"
        )
    lines += ["", "## Margins: how close each run came to the thresholds", ""]
    keys = list(records[0].margins)
    lines.append("| case | seed | " + " | ".join(keys) + " |")
    lines.append("|---|---|" + "---|" * len(keys))
    for r in records:
        values = " | ".join(f"{r.margins[k]:.3g}" for k in keys)
        lines.append(f"| {r.case.name} | {r.seed} | {values} |")
    lines += ["", "## Per rule: how often it fired, by case", ""]
    rules = [
        "profile",
        "level",
        "growth",
        "pcc",
        "extremes",
        "reward",
        "entropy",
        "grad_norm",
        "length",
    ]
    labels = list(dict.fromkeys(r.case.name for r in records))
    lines.append("| rule | " + " | ".join(labels) + " |")
    lines.append("|---|" + "---|" * len(labels))
    for rule in rules:
        cells = []
        for label in labels:
            runs = [r for r in records if r.case.name == label]
            fired = sum(any(f.rule == rule for f in r.alarm + r.collapse) for r in runs)
            cells.append(f"{fired}/{len(runs)}")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--cases", nargs="+", default=None, help="labels to run (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="tim-rl-calibration-"))
    chosen = [
        c for c in cases(args.steps) if args.cases is None or {c.label, c.name} & set(args.cases)
    ]
    records = []
    for case in chosen:
        for seed in args.seeds:
            records.append(measure(case, seed, args.steps, runs_dir))
            print(f"{case.name} seed {seed}: {records[-1].seconds:.0f} s", flush=True)
    args.out.write_text(render(records, args.steps))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
