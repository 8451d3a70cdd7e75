"""The seeds' comparisons in miniature (docs/reproduction.md): runs, a table, and plots.

``python -m conformance.rl.reproduce --runs-dir DIR [--plots docs/figures] [--steps N]`` runs
each experiment once (seed 0) on the embedded stack and prints a markdown table; with
``--plots`` it also draws the curves (needs matplotlib, a dev tool, not a dependency). Runs
already in ``DIR`` are reused, so the table and plots can be redrawn without rerunning.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from conformance.rl.detectors import collapse, mismatch_alarm
from conformance.rl.loop import RunConfig, build_stack, run_smoke
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec

#: the fraction of a run's steps whose medians make its "early" and "late" figures
EDGE = 0.2
BASE_LR = RunConfig().lr
#: a re-introduced mismatch from step 0 (VeXact), std ρ ≈ 0.1 on the embedded model
INJECT = Scenario("inject", strength=0.05)


@dataclass(frozen=True)
class Experiment:
    name: str
    question: str
    engine_dtype: str = "bfloat16"
    scenario: Scenario = field(default_factory=lambda: Scenario("natural"))
    remedy: str = "none"
    lr: float = BASE_LR
    long: bool = False


EXPERIMENTS = (
    Experiment("exact", "natural vs exact", "float32", Scenario("exact")),
    Experiment("natural-bf16", "natural vs exact; growth vs LR"),
    Experiment("biased-d2", "biased vs unbiased", scenario=Scenario("biased", strength=2.0)),
    Experiment("unbiased-s0.2", "biased vs unbiased", scenario=Scenario("unbiased", strength=0.2)),
    Experiment("lr-1e-4", "growth vs LR", lr=1e-4),
    Experiment("lr-1e-3", "growth vs LR", lr=1e-3),
    Experiment("lr-3e-3", "growth vs LR; remedies at high LR", lr=3e-3),
    Experiment("lr-3e-3-tis", "remedies at high LR", remedy="tis", lr=3e-3),
    Experiment("lr-3e-3-lr-decay", "remedies at high LR", remedy="lr-decay", lr=3e-3),
    Experiment("inject-0.05", "remedies under injection", "float32", INJECT),
    Experiment("inject-0.05-tis", "remedies under injection", "float32", INJECT, remedy="tis"),
    Experiment("long-exact", "long responses", "float32", Scenario("exact"), long=True),
    Experiment("long-natural-bf16", "long responses", long=True),
)  # fmt: skip


def run(exp: Experiment, steps: int, runs_dir: Path, long_steps: int) -> list[dict[str, Any]]:
    out = runs_dir / exp.name
    n = long_steps if exp.long else steps
    path = out / "rl.jsonl"
    if not (path.is_file() and len(path.read_text().splitlines()) == n):
        # long answers cost ~10× per step on CPU: fewer prompts per step keep the run bounded
        prompts = 2 if exp.long else RunConfig().prompts
        warm = 60 if exp.long else RunConfig().warm_steps
        config = RunConfig(
            scenario=exp.scenario, remedy=exp.remedy, steps=n, lr=exp.lr, long=exp.long,
            prompts=prompts, warm_steps=warm,
        )  # fmt: skip
        engine, backend = build_stack(replace(StackSpec(), engine_dtype=exp.engine_dtype))
        try:
            run_smoke(engine, backend, config, out)
        finally:
            engine.close()
            backend.close()
    return [json.loads(line) for line in path.read_text().splitlines()]


def edge_median(values: Sequence[float], late: bool) -> float:
    k = max(1, int(EDGE * len(values)))
    return statistics.median(values[-k:] if late else values[:k])


def row_of(exp: Experiment, rows: list[dict[str, Any]]) -> dict[str, Any]:
    std = [r["mismatch"]["rho_std"] for r in rows]
    reward = [r["reward"] for r in rows]
    early, late = edge_median(std, False), edge_median(std, True)
    alarm, crash = mismatch_alarm(rows), collapse(rows)
    return {
        "experiment": exp.name,
        "question": exp.question,
        "steps": len(rows),
        "reward early": edge_median(reward, False),
        "reward late": edge_median(reward, True),
        "accuracy late": edge_median([r["accuracy"] for r in rows], True),
        "std ρ early": early,
        "std ρ late": late,
        "growth": late / early if early > 0 else float("nan"),
        "|J| late": edge_median([abs(r["J"]) for r in rows], True),
        "length late": edge_median([r["response_length"] for r in rows], True),
        "alarm": f"{alarm.signal}@{alarm.step}" if alarm.fired else "—",
        "collapse": f"{crash.signal}@{crash.step}" if crash.fired else "—",
        "s/step": statistics.mean(r["seconds"] for r in rows),
    }


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, list[dict[str, Any]]], groups: dict[str, list[str]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    for title, names in groups.items():
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        for name in names:
            rows = runs[name]
            steps = [r["step"] for r in rows]
            axes[0].plot(steps, smooth([r["reward"] for r in rows]), label=name)
            axes[1].plot(steps, smooth([r["mismatch"]["rho_std"] for r in rows]), label=name)
        axes[0].set_title("reward (rolling mean 9)")
        axes[1].set_title("std ρ (rolling mean 9)")
        axes[1].set_yscale("symlog", linthresh=1e-4)
        for ax in axes:
            ax.set_xlabel("step")
        axes[0].legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"rl-{title.replace(' ', '-')}.png", dpi=80)
        plt.close(fig)


def smooth(values: Sequence[float], k: int = 9) -> list[float]:
    return [statistics.mean(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--long-steps", type=int, default=30)
    parser.add_argument("--only", nargs="+", default=None, help="experiment names to run")
    parser.add_argument("--plots", type=Path, default=None, help="folder for PNG plots")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = [e for e in EXPERIMENTS if args.only is None or e.name in args.only]
    runs = {e.name: run(e, args.steps, args.runs_dir, args.long_steps) for e in chosen}
    print(table([row_of(e, runs[e.name]) for e in chosen]))
    if args.plots:
        groups: dict[str, list[str]] = {}
        for e in chosen:
            for question in e.question.split("; "):
                groups.setdefault(question, []).append(e.name)
        plot(runs, groups, args.plots)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
