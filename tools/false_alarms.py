"""False alarms of the group-independence, support and sampler-fidelity checks on sound stacks.

Runs the ``group_sampling`` and ``sampler_fidelity`` suites on the reference stack
(``hf-generate`` vs ``hf`` on the embedded model) in each precision under its own profile, once
per Hypothesis seed, and prints one markdown row per precision: runs, failed checks per suite,
the identical child pairs against the number independent draws predict, and the sampled tokens
the support audit held (every suite's, top-k/top-p on) against those it found outside. A sound
stack should fail nothing: each check's false-alarm rate is bounded by design (group
independence and the fidelity tests at ≤ 1e-3 per run, the support property at 0 with the
profile's margin), and this measures it. docs/sampler-fidelity.md holds the numbers.

Run from the repository root (about 20 s a run on one CPU core):

    PYTHONPATH=. python tools/false_alarms.py --runs 20 --work /tmp/false-alarms

On another model, under a profile of its own (one precision per profile), e.g. SmolLM2-135M
(about 4 minutes a run):

    tim-conformance calibrate --model smollm2 --out smol-fp32.toml
    PYTHONPATH=. python tools/false_alarms.py --runs 5 --work /tmp/fa-smol --model smollm2 \
        --dtype float32 --profile smol-fp32.toml
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SUITES = ("suites/test_group_sampling.py", "suites/test_sampler_fidelity.py")
#: engine precision → the profile a sound stack in it is held to
PRECISIONS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def run_once(
    dtype: str, seed: int, out: Path, model: Path | None = None, profile: str | None = None
) -> dict:
    """One seeded run of the suites (on ``model``, under ``profile``: by default the embedded
    model under the profile its precision implies); its report.json."""
    on = ["--tim-model", str(model)] if model else []
    if not (out / "report.json").is_file():  # reused: a rerun only adds seeds
        subprocess.run(
            [sys.executable, "-m", "pytest", *SUITES, "--tim-engine-dtype", dtype, *on,
             "--tim-profile", profile or PRECISIONS[dtype], f"--hypothesis-seed={seed}",
             "--tim-report", str(out), "-q", "-p", "no:cacheprovider"],
            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    return json.loads((out / "report.json").read_text())


def tally(reports: list[dict]) -> dict[str, float]:
    """Failed checks per suite, identical/expected child pairs, audited/outside tokens."""
    total = {
        "group_failed": 0.0,
        "fidelity_failed": 0.0,
        "identical_pairs": 0.0,
        "expected_pairs": 0.0,
        "support_tokens": 0.0,
        "outside": 0.0,
    }
    for report in reports:
        for check in report["checks"]:
            metrics = check["metrics"]
            failed = check["status"] == "fail"
            total["group_failed"] += failed and check["suite"] == "group_sampling"
            total["fidelity_failed"] += failed and check["suite"] == "sampler_fidelity"
            total["identical_pairs"] += metrics.get("identical_child_pairs", 0.0)
            total["expected_pairs"] += metrics.get("expected_identical_pairs", 0.0)
            total["support_tokens"] += metrics.get("support_tokens", 0.0)
            total["outside"] += metrics.get("out_of_support_tokens", 0.0)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="seeds per precision")
    parser.add_argument("--work", type=Path, required=True, help="folder for the runs' reports")
    parser.add_argument("--dtype", action="append", choices=PRECISIONS, help="default: all")
    parser.add_argument("--model", type=Path, help="model folder (default: the embedded one)")
    parser.add_argument("--profile", help="the profile of the one --dtype given")
    args = parser.parse_args()
    if args.profile and len(args.dtype or ()) != 1:
        parser.error("--profile holds one precision's bounds: give exactly one --dtype")
    print(
        "| engine dtype (profile) | runs | group_sampling checks failed | identical child pairs "
        "(independent draws predict) | sampler_fidelity checks failed | sampled tokens audited "
        "| outside the support |"
    )
    print("|---|---|---|---|---|---|---|")
    for dtype in args.dtype or PRECISIONS:
        reports = [
            run_once(dtype, seed, args.work / f"{dtype}-{seed}", args.model, args.profile)
            for seed in range(args.runs)
        ]
        t = tally(reports)
        profile = args.profile or PRECISIONS[dtype]
        print(
            f"| {dtype} ({profile}) | {len(reports)} | {t['group_failed']:.0f} | "
            f"{t['identical_pairs']:.0f} ({t['expected_pairs']:.1f}) | "
            f"{t['fidelity_failed']:.0f} | {t['support_tokens']:,.0f} | {t['outside']:.0f} |"
        )


if __name__ == "__main__":
    main()
