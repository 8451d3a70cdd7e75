"""The seeds' claims redone in their own regime (docs/reproduction.md): runs, tables, plots.

``python tools/rl_reproduce.py --runs-dir DIR --doc docs/reproduction.md --plots
docs/figures`` runs every experiment of every study on the embedded stack, once per seed,
and rewrites the generated blocks of the doc (``<!-- reproduce:KEY -->`` …
``<!-- /reproduce:KEY -->``, one per study) and the plots. Finished runs in ``DIR`` are reused,
so after a change to a table the same command redraws everything without rerunning; ``--only``
picks studies. Plots need matplotlib (a dev tool, not a dependency of the harness).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from conformance.models import model_folder
from conformance.rl.detectors import collapse, mismatch_alarm
from conformance.rl.loop import RunConfig, run_smoke, started_stack
from conformance.rl.scenarios import Scenario
from conformance.stack import StackSpec

Rows = list[dict[str, Any]]

#: the fraction of a run's steps whose medians make its "early" and "late" figures
EDGE = 0.2
SEEDS = (0, 1, 2)
#: the seeds' regime at toy scale (objective-level-hacking §4.1: 128 prompts × 16 responses,
#: 4 updates per step): 4 prompts × 8 responses, 4 mini-batch updates of 8 responses each
REGIME: dict[str, Any] = {"prompts": 4, "group": 8, "updates_per_step": 4}
#: long answers (128–160 tokens) cost ≈ 8× per response: 2 prompts × 8, 60 warm-start steps
LONG: dict[str, Any] = {"long": True, "prompts": 2, "warm_steps": 60}
#: steps of a run (×4 updates: 1200 gradient steps, Table 1 reports 4–400), and of the
#: long-answer runs
STEPS = 300
LONG_STEPS = 150


@dataclass(frozen=True)
class Experiment:
    """One training configuration on one stack, run once per seed."""

    name: str
    engine_dtype: str = "bfloat16"
    scenario: Scenario = field(default_factory=lambda: Scenario("natural"))
    remedy: str = "none"
    steps: int = STEPS
    #: RunConfig fields beyond the regime's (lr, old_logprobs, clip_high, long, ...)
    settings: tuple[tuple[str, Any], ...] = ()
    #: the seeds it runs with (None: the command's ``--seeds``)
    seeds: tuple[int, ...] | None = None
    #: the policy (a ``--model`` value; None: the embedded default model)
    model: str | None = None
    #: the trainer's ``--backend-option`` settings (e.g. routing replay)
    backend_options: tuple[tuple[str, str], ...] = ()

    def config(self, seed: int) -> RunConfig:
        """The run's configuration (validated before anything runs: see ``main``)."""
        return RunConfig(
            scenario=self.scenario,
            remedy=self.remedy,
            steps=self.steps,
            seed=seed,
            **{**REGIME, **dict(self.settings)},
        )


EXACT = Scenario("exact")


def exp(
    name: str,
    *,
    dtype: str = "bfloat16",
    scenario: Scenario | None = None,
    remedy: str = "none",
    steps: int = STEPS,
    seeds: tuple[int, ...] | None = None,
    model: str | None = None,
    backend_options: tuple[tuple[str, str], ...] = (),
    **settings: Any,
) -> Experiment:
    """An experiment; ``settings`` are ``RunConfig`` fields beyond the regime's."""
    scenario = scenario or Scenario("natural")
    items = tuple(sorted(settings.items()))
    return Experiment(name, dtype, scenario, remedy, steps, items, seeds, model, backend_options)


def pair(name: str, *, seeds: tuple[int, ...] | None = (0,), **kwargs: Any) -> list[Experiment]:
    """The positive-control search's unit: a mismatched run and its ``exact`` control with the
    same settings and seeds (the engine in fp32 and its log-probs replaced: ρ ≡ 1)."""
    steps = kwargs.pop("steps", STEPS)
    mismatched = exp(f"{name}, bf16", steps=steps, seeds=seeds, **kwargs)
    kwargs.pop("scenario", None)
    control = exp(f"{name}, exact", dtype="float32", scenario=EXACT, steps=steps, seeds=seeds,
                  **kwargs)  # fmt: skip
    return [mismatched, control]


GSPO = {"remedy": "gspo"}
ENGINE = {"old_logprobs": "engine"}


@dataclass(frozen=True)
class Study:
    """A seed claim and the experiments that test it."""

    key: str
    claim: str
    experiments: tuple[Experiment, ...]
    #: the experiments its plot draws (empty: all)
    plotted: tuple[str, ...] = ()
    #: the ``FIGURES`` its table shows (empty: all)
    columns: tuple[str, ...] = ()


#: the experiments several studies share (one run each, one row in each table)
R_BF16 = exp("K=4, recompute, bf16")
R_GSPO = exp("K=4, recompute, gspo, bf16", **GSPO)
#: under ``exact`` the two old policies are the same run (ρ ≡ 1: lp_infer := lp_recompute)
E_EXACT = exp("K=4, engine, exact", dtype="float32", scenario=EXACT, **ENGINE)
E_BF16 = exp("K=4, engine, bf16", **ENGINE)
LONG_EXACT = exp("K=4, engine, long, exact", dtype="float32", scenario=EXACT, steps=LONG_STEPS,
                 **ENGINE, **LONG)  # fmt: skip
LONG_BF16 = exp("K=4, engine, long, bf16", steps=LONG_STEPS, **ENGINE, **LONG)
EDGE_LR = 1e-3
#: the MoE arm: the embedded MoE policy, shorter runs (its steps cost ~5× the dense model's)
MOE: dict[str, Any] = {"model": "embedded:moe", "steps": 100}

STUDIES = (
    Study(
        "clip",
        "Stronger token clipping makes mismatch grow faster; sequence clipping (GSPO) does not "
        "(objective-level-hacking §4.3, Fig. 4, Table 1)",
        (
            R_BF16,
            exp("K=4, recompute, bf16, clip-high 0.24", clip_high=0.24),
            exp("K=4, recompute, bf16, clip-high 0.28", clip_high=0.28),
            R_GSPO,
        ),
    ),
    Study(
        "distortion",
        "A biased token-weight distortion (δ on tokens with π < 0.1, Eq. 18; up or down) makes "
        "mismatch grow and the run degrade; unbiased noise N(1, 0.2²) does not "
        "(objective-level-hacking §4.4, §5.1, Fig. 5, App. B.2)",
        (
            R_GSPO,
            *(
                exp(f"gspo, bf16, δ={d:g}", scenario=Scenario("biased", strength=d), **GSPO)
                for d in (1.2, 2.0, 3.0, 0.0)
            ),
            exp("gspo, bf16, noise σ=0.2", scenario=Scenario("unbiased", strength=0.2), **GSPO),
        ),
    ),
    Study(
        "remedies",
        "Against a natural bf16 mismatch, TIS and MIS slow the damage and the length-decay LR "
        "(Algorithm 1) stabilises training (objective-level-hacking Fig. 2; lr-scheduling §3.3); "
        "run at lr 1e-3, where runs in this regime collapse",
        (
            exp("lr 1e-3, exact", dtype="float32", scenario=EXACT, lr=EDGE_LR),
            exp("lr 1e-3, bf16", lr=EDGE_LR),
            exp("lr 1e-3, bf16, tis", remedy="tis", lr=EDGE_LR),
            exp("lr 1e-3, bf16, mis", remedy="mis", lr=EDGE_LR),
            exp("lr 1e-3, bf16, lr-decay", remedy="lr-decay", lr=EDGE_LR),
        ),
    ),
    Study(
        "old-policy",
        "Putting the engine's log-probs into the ratio (verl bypass, decoupled PPO) lets the "
        "mismatch into the objective; recomputing the old policy keeps it out",
        (E_EXACT, R_BF16, E_BF16),
    ),
    Study(
        "long",
        "Long answers make the mismatch matter more (per-sequence error grows with T; "
        "lr-scheduling Thm 3.1: the gradient bias grows as T²)",
        (
            LONG_EXACT,
            LONG_BF16,
            exp("K=4, recompute, long, bf16", steps=LONG_STEPS, **LONG),
        ),
    ),
    Study(
        "moe",
        "On an MoE policy, routing replay (R3: the trainer recomputes and trains with the experts "
        "the engine chose) removes the part of a natural bf16 mismatch that routing flips cause "
        "(R3 arXiv 2510.11370; Miles #2722: log-prob error 0.369 → 0.139 with id-only replay)",
        (
            exp("moe, bf16", **MOE),
            exp(
                "moe, bf16, replay ids", backend_options=(("routing_replay", "engine-ids"),), **MOE
            ),
            exp(
                "moe, bf16, replay ids+weights",
                backend_options=(("routing_replay", "engine"),),
                **MOE,
            ),
        ),
        columns=(
            "reward early",
            "reward late",
            "accuracy late",
            "std ρ early",
            "std ρ late",
            "mean |Δlp|",
            "max |Δlp|",
            "grad norm late",
            "clip seq",
        ),
    ),
    Study(
        "search",
        "Positive control: some realistic setting makes the *mismatch* collapse a run whose "
        "zero-mismatch (`exact`) control, same seed and settings, does not collapse",
        (
            E_BF16,
            E_EXACT,
            *pair("K=8, engine", updates_per_step=8, **ENGINE),
            *pair("K=4, engine, lr 1e-3", lr=1e-3, seeds=SEEDS, **ENGINE),
            *pair("K=4, engine, lr 5e-4", lr=5e-4, seeds=SEEDS, **ENGINE),
            *pair("K=4, engine, lr 7e-4", lr=7e-4, seeds=SEEDS, **ENGINE),
            *pair("K=4, engine, gspo", **ENGINE, **GSPO),
            LONG_BF16,
            LONG_EXACT,
            *pair("K=8, engine, long", steps=LONG_STEPS, updates_per_step=8, **ENGINE, **LONG),
            *(
                exp(
                    f"K=4, engine, biased engine δ={d:g}",
                    scenario=Scenario("engine-bias", strength=d),
                    steps=STEPS,
                    seeds=(0,),
                    **ENGINE,
                )
                for d in (2.0, 0.5, 10.0, 0.1)
            ),
            *(
                exp(
                    f"K=4, engine, fp32 + injected {s:g}",
                    dtype="float32",
                    scenario=Scenario("inject", strength=s),
                    steps=STEPS,
                    seeds=(0,),
                    **ENGINE,
                )
                for s in (0.05, 0.1)
            ),
            exp(
                "K=4, engine, lr 5e-4, fp32 + injected 0.1",
                dtype="float32",
                scenario=Scenario("inject", strength=0.1),
                steps=STEPS,
                seeds=SEEDS,
                lr=5e-4,
                **ENGINE,
            ),
        ),
        plotted=tuple(
            f"K=4, engine, lr {lr}, {side}" for lr in ("5e-4", "1e-3") for side in ("bf16", "exact")
        ),
        columns=(
            "reward early",
            "reward late",
            "std ρ early",
            "std ρ late",
            "entropy late",
            "length late",
            "grad norm late",
        ),
    ),
)


def run_dir(runs_dir: Path, experiment: Experiment, seed: int) -> Path:
    name = experiment.name.replace("δ", "delta").replace("σ", "sigma")
    slug = re.sub(r"[^A-Za-z0-9.=+-]+", "_", name).strip("_")
    return runs_dir / f"{slug}-s{seed}"


def run(experiment: Experiment, seed: int, runs_dir: Path, *, start: bool = True) -> Rows:
    """The run's rows, from ``runs_dir`` if it finished there before; a run not there yet is
    started, or with ``start=False`` left out (no rows)."""
    out = run_dir(runs_dir, experiment, seed)
    path = out / "rl.jsonl"
    if not (path.is_file() and len(path.read_text().splitlines()) == experiment.steps):
        if not start:
            return []
        spec = replace(
            StackSpec(),
            engine_dtype=experiment.engine_dtype,
            model=model_folder(experiment.model) if experiment.model else None,
            backend_options=dict(experiment.backend_options),
        )
        with started_stack(spec) as (engine, backend):
            run_smoke(engine, backend, experiment.config(seed), out)
        print(f"ran {out.name}", flush=True)
    return [json.loads(line) for line in path.read_text().splitlines()]


def value(row: dict[str, Any], key: str) -> float:
    return float(row[key] if key in row else row["mismatch"][key])


def edge_median(rows: Rows, key: str, late: bool) -> float:
    k = max(1, int(EDGE * len(rows)))
    part = rows[-k:] if late else rows[:k]
    return statistics.median(value(r, key) for r in part)


def around(rows: Rows, key: str, step: int, half: int = 10) -> float:
    """Mean of ``key`` over the steps ``step ± half`` (Table 1 reports single steps of a
    2048-response batch; ours have 32 responses, so one step is mostly 0 or a few tokens)."""
    near = [value(r, key) for r in rows if abs(int(r["step"]) - step) <= half]
    return statistics.mean(near) if near else math.nan


def growth(rows: Rows) -> float:
    early = edge_median(rows, "rho_std", late=False)
    return edge_median(rows, "rho_std", late=True) / early if early > 0 else math.nan


#: the columns of every study's table: name → figure of one run
FIGURES: dict[str, Callable[[Rows], float]] = {
    "reward early": lambda r: edge_median(r, "reward", False),
    "reward late": lambda r: edge_median(r, "reward", True),
    "accuracy late": lambda r: edge_median(r, "accuracy", True),
    "std ρ early": lambda r: edge_median(r, "rho_std", False),
    "std ρ late": lambda r: edge_median(r, "rho_std", True),
    "growth ×": growth,
    "entropy late": lambda r: edge_median(r, "entropy", True),
    "length late": lambda r: edge_median(r, "response_length", True),
    "grad norm late": lambda r: edge_median(r, "grad_norm", True),
    "clip low": lambda r: statistics.mean(value(x, "clip_low") for x in r),
    "clip high": lambda r: statistics.mean(value(x, "clip_high") for x in r),
    "clip seq": lambda r: statistics.mean(value(x, "clip_seq") for x in r),
    # a routing flip shows in the largest per-token error (off by nats, not by rounding);
    # means over every step, as the clip fractions
    "mean |Δlp|": lambda r: statistics.mean(value(x, "abs_diff_mean") for x in r),
    "max |Δlp|": lambda r: statistics.mean(value(x, "abs_diff_max") for x in r),
}


def spread(values: Sequence[float]) -> str:
    """``mean (min–max)`` over seeds."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "—"
    mean = statistics.mean(finite)
    if len(finite) == 1 or max(finite) == min(finite):
        return f"{mean:.3g}"
    return f"{mean:.3g} ({min(finite):.3g}–{max(finite):.3g})"


def verdict_counts(runs: Sequence[Rows]) -> tuple[str, str]:
    alarms = [mismatch_alarm(r) for r in runs]
    crashes = [collapse(r) for r in runs]

    def show(verdicts: list[Any]) -> str:
        fired = [v for v in verdicts if v.fired]
        steps = ",".join(f"{v.signal}@{v.step}" for v in fired)
        return f"{len(fired)}/{len(verdicts)}" + (f" ({steps})" if fired else "")

    return show(alarms), show(crashes)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def study_table(study: Study, runs: dict[str, list[Rows]]) -> str:
    figures = {k: f for k, f in FIGURES.items() if not study.columns or k in study.columns}
    header = ["experiment", "seeds", "steps", *figures, "alarm", "collapse", "s/step"]
    rows = []
    for e in study.experiments:
        seeds = runs[e.name]
        if not seeds:
            rows.append([e.name, "0", str(e.steps), *["not run"] * (len(header) - 3)])
            continue
        cells = [spread([figure(r) for r in seeds]) for figure in figures.values()]
        seconds = statistics.mean(statistics.mean(x["seconds"] for x in r) for r in seeds)
        rows.append(
            [
                e.name,
                str(len(seeds)),
                str(e.steps),
                *cells,
                *verdict_counts(seeds),
                f"{seconds:.2f}",
            ]
        )
    return markdown_table(header, rows)


def clip_table(study: Study, runs: dict[str, list[Rows]]) -> str:
    """Table 1's layout: clip fraction per token (and per sequence for GSPO) at three steps."""
    last = study.experiments[0].steps - 11
    steps = (4, last // 2, last)
    rows = []
    for e in study.experiments:
        keys = ("clip_seq",) if e.remedy == "gspo" else ("clip_low", "clip_high")
        for key in keys:
            cells = [spread([around(r, key, s) for r in runs[e.name]]) for s in steps]
            rows.append([e.name, key, *cells])
    return markdown_table(["experiment", "fraction", *(f"step {s}" for s in steps)], rows)


def block(study: Study, runs: dict[str, list[Rows]]) -> str:
    parts = [
        f"Claim: {study.claim}.",
        "",
        "Cells are mean (min–max) over the seeds; alarm and collapse count the runs whose "
        "detector fired (rule@step).",
        "",
        study_table(study, runs),
    ]
    if study.key == "clip":
        parts += ["", "Clip fractions (Table 1's layout; mean of steps ±10):", ""]
        parts.append(clip_table(study, runs))
    parts += ["", f"![{study.key}](figures/rl-{study.key}.png)"]
    return "\n".join(parts)


def write_blocks(doc: Path, blocks: dict[str, str]) -> None:
    """Replace each ``<!-- reproduce:KEY -->`` … ``<!-- /reproduce:KEY -->`` block in ``doc``."""
    text = doc.read_text()
    for key, body in blocks.items():
        start, end = f"<!-- reproduce:{key} -->", f"<!-- /reproduce:{key} -->"
        if start not in text or end not in text:
            raise SystemExit(f"{doc} has no {start} … {end} block")
        head, rest = text.split(start, 1)
        text = head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]
    doc.write_text(text)


#: curves on every study's plot: (row key, title, log scale)
CURVES = (
    ("reward", "reward", False),
    ("rho_std", "std ρ (mismatch)", True),
    ("entropy", "entropy", True),
    ("clip_fraction", "clip fraction (tokens)", True),
    ("grad_norm", "grad norm (before clip)", True),
    ("response_length", "response length", False),
)


def plot(study: Study, runs: dict[str, list[Rows]], out: Path) -> None:
    """Mean over seeds (rolling mean of 15 steps), with the seeds' min–max as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, grid = plt.subplots(2, len(CURVES) // 2, figsize=(12, 5.4))
    axes = list(grid.flat)
    for e in study.experiments:
        seeds = runs[e.name]
        if not seeds or (study.plotted and e.name not in study.plotted):
            continue
        for ax, (key, title, log) in zip(axes, CURVES, strict=True):
            per_seed = [smooth([value(r, key) for r in rows]) for rows in seeds]
            n = min(map(len, per_seed))
            mean = [statistics.mean(c[i] for c in per_seed) for i in range(n)]
            (line,) = ax.plot(range(n), mean, label=e.name, lw=1)
            low = [min(c[i] for c in per_seed) for i in range(n)]
            high = [max(c[i] for c in per_seed) for i in range(n)]
            ax.fill_between(range(n), low, high, color=line.get_color(), alpha=0.15, lw=0)
            ax.set_title(title, fontsize=9)
            if log:
                ax.set_yscale("symlog", linthresh=1e-4)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("step", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=65)
    plt.close(fig)
    # a 256-colour palette keeps each committed PNG near 50 kB instead of 150 kB
    from PIL import Image

    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(256)
    image.save(out / f"rl-{study.key}.png", optimize=True)


def smooth(values: Sequence[float], k: int = 15) -> list[float]:
    return [statistics.mean(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--only", nargs="+", default=None, help="study keys to run")
    parser.add_argument("--doc", type=Path, default=None, help="markdown doc with the blocks")
    parser.add_argument("--plots", type=Path, default=None, help="folder for PNG plots")
    parser.add_argument(
        "--no-run", action="store_true", help="draw from the finished runs only, start none"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = [s for s in STUDIES if args.only is None or s.key in args.only]
    for study in chosen:  # a bad configuration fails here, not hours into the runs
        for e in study.experiments:
            e.config(0)
    blocks = {}
    for study in chosen:
        runs = {
            e.name: [
                rows
                for s in e.seeds or args.seeds
                if (rows := run(e, s, args.runs_dir, start=not args.no_run))
            ]
            for e in study.experiments
        }
        blocks[study.key] = block(study, runs)
        print(blocks[study.key] + "\n", flush=True)
        if args.plots:
            plot(study, runs, args.plots)
    if args.doc:
        write_blocks(args.doc, blocks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
