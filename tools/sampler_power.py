"""Power and false alarms of the sampler-fidelity suite against a sampler off inside its support.

Runs ``suites/test_sampler_fidelity.py`` on the embedded model once per Hypothesis seed, with the
sound reference engine (``--tv 0``) or ``tests.support.engines:SharpenedSampler`` at each total
variation ``--tv``, and prints one markdown row per (precision, tv): the runs, the runs that fail
(any spec), and per test the specs it caught among those the defect touches (top-k or top-p on):
the PIT/top-token fidelity p-value, at the bound it had before the log-prob score came
(``SAMPLER_FALSE_ALARMS_PER_RUN`` over the specs) and at its share now, and the log-prob score
(``conformance.sampler_stats.logp_score``), with that score's mean z. docs/sampler-fidelity.md
holds the numbers. Run from the repository root (about 8 s a run on one core):

    PYTHONPATH=. python tools/sampler_power.py --work /tmp/power --seeds 20 --tv 0 0.02 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SUITE = "suites/test_sampler_fidelity.py"
PRECISIONS = {"float32": "fp32", "bfloat16": "bf16"}
#: the specs SharpenedSampler alters: those with top-k or top-p on
TOUCHED = ("top_k]", "top_p]", "cold_top_k_top_p]", "hot_top_k_top_p]", "min_p_top_k_top_p]")


def run_once(dtype: str, tv: float, seed: int, out: Path) -> dict:
    """One seeded run of the suite; its report.json (reused if there)."""
    engine = ["--tim-engine", "tests.support.engines:SharpenedSampler",
              "--tim-engine-option", f"tv={tv}"] if tv else []  # fmt: skip
    if not (out / "report.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "pytest", SUITE, *engine, "--tim-engine-dtype", dtype,
             "--tim-profile", PRECISIONS[dtype], f"--hypothesis-seed={seed}",
             "--tim-report", str(out), "-q", "-p", "no:cacheprovider", "--benchmark-skip"],
            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    return json.loads((out / "report.json").read_text())


def tally(reports: list[dict], old_bound: float) -> dict[str, float]:
    """Failed runs; specs (touched ones) caught by each test; the score's mean z there."""
    total = {"failed_runs": 0, "specs": 0, "old": 0, "fidelity": 0, "score": 0, "either": 0}
    zs, small = [], []
    for report in reports:
        total["failed_runs"] += any(c["status"] == "fail" for c in report["checks"])
        for check in report["checks"]:
            m = check["metrics"]
            if "sampler_logp_p_value" in m:
                small.append(m["sampler_logp_p_value"] < 0.01)
            if not check["nodeid"].endswith(TOUCHED) or "sampler_logp_p_value" not in m:
                continue
            fidelity = m["sampler_p_value"] < m["sampler_p_value_bound"]
            score = m["sampler_logp_p_value"] < m["sampler_logp_p_value_bound"]
            total["specs"] += 1
            total["old"] += m["sampler_p_value"] < old_bound
            total["fidelity"] += fidelity
            total["score"] += score
            total["either"] += fidelity or score
            zs.append(m["sampler_logp_z"])
    total["z"] = statistics.fmean(zs) if zs else float("nan")
    total["small"] = f"{sum(small)} of {len(small)}"
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="runs per cell (seeds 0..N-1)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--tv", type=float, nargs="+", default=[0.0, 0.05], help="0: sound")
    parser.add_argument("--dtype", nargs="+", choices=PRECISIONS, default=["float32"])
    parser.add_argument("--work", type=Path, required=True, help="folder for the runs' reports")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    args = parser.parse_args()
    from conformance.metric_table import SAMPLER_FALSE_ALARMS_PER_RUN
    from suites.test_sampler_fidelity import SPECS

    old_bound = SAMPLER_FALSE_ALARMS_PER_RUN / len(SPECS)
    print(
        "| engine dtype | tv | runs | runs failed | top-k/top-p specs | caught by fidelity "
        f"p < {old_bound:.3g} (before) | by fidelity now | by log-prob score | either now "
        "| score's mean z | all specs' score p < 0.01 (1 % due if sound) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with ThreadPoolExecutor(args.jobs) as pool:
        for dtype in args.dtype:
            for tv in args.tv:
                work = args.work / f"{dtype}-tv{tv:g}"
                cells = [(dtype, tv, s, work / str(s)) for s in seeds]
                reports = list(pool.map(lambda cell: run_once(*cell), cells))
                t = tally(reports, old_bound)
                print(
                    f"| {dtype} | {tv:g} | {len(reports)} | {t['failed_runs']} | {t['specs']} | "
                    f"{t['old']} | {t['fidelity']} | {t['score']} | {t['either']} | "
                    f"{t['z']:+.2f} | {t['small']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
