"""The transfer table of docs/transfer.md: do the shipped profiles fit models they were not
measured on?

For each model given: calibrate its own fp32, bf16 and fp16 profiles (quick depth, as a user
would), run ``certify`` of the sound reference stack (hf-generate vs hf) in each precision under
the model's own profile, and judge the same run's checks under the shipped profile too (as
``gate --profile`` does: every check's metrics against the other profile's bounds for its suite
and pool; the examples drawn do not depend on the profile, and a per-example bound is broken
by some example exactly when the check's extreme breaks it); then certify the broken test
engines under the model's own profile. One markdown row per (model, precision): each verdict
and the metric nearest its bound (or the violated one furthest past it).

    tim-conformance make-model big/qwen3 --arch qwen3 --seed 5 --vocab 8192 --layers 8 --hidden 512
    python tools/transfer_table.py big/qwen3 [more models] --work transfer/ [--examples 5]
        [--seed 1]  # another Hypothesis seed: the runs get their own folders

Runs already in ``--work`` (a ``report.json`` there) are read, not rerun, so an interrupted
table resumes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from conformance.metric_table import metric
from conformance.models import declared_experts
from conformance.options import implied_profile
from conformance.profiles import Profile, load_profile

#: precision → (calibrate's --engine-dtype, certify's dtype flags)
PRECISIONS = {
    "fp32": ("float32", []),
    "bf16 engine": ("bfloat16", ["--engine-dtype", "bfloat16"]),
    "bf16 both": ("bfloat16", ["--engine-dtype", "bfloat16", "--backend-dtype", "bfloat16"]),
    "fp16": ("float16", ["--engine-dtype", "float16"]),
}
ENGINES = "tests.support.engines:"
#: broken engine → (its options and dtype flags, the suite it is certified on)
BROKEN = {
    "LateDrift": ([], "rollout_parity"),
    "RunToRunNoise": ([], "determinism"),
    "ConstantBias 0.01 (bf16)": (
        ["--engine-option", "bias=0.01", "--engine-dtype", "bfloat16"],
        "rollout_parity",
    ),
}


def tim(*args: str, log: Path) -> int:
    with log.open("w") as out:
        return subprocess.call(
            [sys.executable, "-m", "conformance", *args], stdout=out, stderr=subprocess.STDOUT
        )


def profile_of(model: Path, dtype: str, work: Path) -> Path:
    path = work / f"{model.name}-{dtype}.toml"
    if not path.is_file():
        args = ["calibrate", "--model", str(model), "--engine-dtype", dtype, "--out", str(path)]
        if tim(*args, log=path.with_suffix(".log")) != 0:
            raise SystemExit(f"calibrate failed: see {path.with_suffix('.log')}")
    return path


def certified(run: Path, *args: str) -> dict:
    if not (run / "report.json").is_file():
        tim("certify", *args, "--out", str(run), log=run.with_suffix(".log"))
    return json.loads((run / "report.json").read_text())


def judged(report: dict, profile: Profile) -> str:
    """The verdict ``profile`` gives the report's checks, and the metric nearest its bound (as
    a share of the bound's distance from the ideal)."""
    failed, best = False, None
    for check in report["checks"]:
        if check["status"] not in ("pass", "fail"):
            continue
        bounds = profile.bounds(check["suite"], check.get("tokens"))
        violated = {v.metric for v in profile.check(
            check["metrics"], tokens=check.get("tokens"), suite=check["suite"]
        )}  # fmt: skip
        failed |= bool(violated) or (check["status"] == "fail" and not check["violations"])
        for name, bound in bounds.items():
            value, fact = check["metrics"].get(name), metric(name)
            # a bound no value can break (exact_match_rate ≥ 0: "not required") is no margin
            if value is None or fact.deviation(bound) == 0 or (fact.bound == "min" and bound <= 0):
                continue
            judged_pool = profile.judges_pool(check.get("tokens")) or fact.scope == "example"
            share = fact.deviation(value) / fact.deviation(bound) if judged_pool else 0.0
            if best is None or share > best[0]:
                best = (share, name, value, bound, check["suite"])
    word = "**FAIL**" if failed else "pass"
    if report["verdict"] not in ("pass", "fail"):
        word = report["verdict"]
    if best is None:
        return word
    share, name, value, bound, suite = best
    return f"{word}: {name} {_shown(name, value)} / {_shown(name, bound)} ({share:.0%}, {suite})"


def _shown(name: str, value: float) -> str:
    """A value as its distance from an ideal of 1 where that is the scale (PCC 1 − 3.1e-05)."""
    fact = metric(name)
    if fact.ideal == 1.0 and 0 < fact.deviation(value) < 0.01:
        return f"1 {'+' if value > 1 else '−'} {fact.deviation(value):.2g}"
    return f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--examples", default="20", help="certify's --examples (default 20)")
    parser.add_argument("--seed", default="0", help="certify's --seed (default 0)")
    parser.add_argument(
        "--precision", action="append", choices=PRECISIONS, help="only these (default: all)"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    seeded = "" if args.seed == "0" else f"-seed{args.seed}"
    print("| model | precision | shipped profile | own calibrated profile |")
    print("|---|---|---|---|", flush=True)
    for model in args.models:
        moe = declared_experts(model) > 0
        for label in args.precision or PRECISIONS:
            dtype, flags = PRECISIONS[label]
            own = profile_of(model, dtype, args.work)
            run = args.work / f"{model.name}-{label.replace(' ', '-')}{seeded}"
            report = certified(
                run, "--model", str(model), *flags, "--profile", str(own),
                "--examples", args.examples, "--seed", args.seed,
            )  # fmt: skip
            backend = (
                flags[flags.index("--backend-dtype") + 1]
                if "--backend-dtype" in flags
                else "float32"
            )
            shipped = load_profile(implied_profile(dtype, backend, moe=moe))
            print(
                f"| {model.name} | {label} | {shipped.name}: {judged(report, shipped)} "
                f"| {judged(report, load_profile(own))} |",
                flush=True,
            )
        for engine, (options, suite) in BROKEN.items():
            name = engine.split()[0]
            dtype = "bfloat16" if "bfloat16" in options else "float32"
            own = profile_of(model, dtype, args.work)
            report = certified(
                args.work / f"{model.name}-broken-{name}{seeded}", "--model", str(model),
                "--engine", ENGINES + name, *options, "--suite", suite, "--profile", str(own),
                "--seed", args.seed,
            )  # fmt: skip
            print(
                f"| {model.name} | broken: {engine}, {suite} | — "
                f"| {judged(report, load_profile(own))} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
