"""Detection power on one model: the smallest bias and noise certify's rollout parity catches.

One certify per value (``--suite rollout_parity``, seed 0) of the broken engines
``tests.support.engines:ConstantBias`` (δ nats on every reported log-prob past the 16th
generated token) and ``TokenNoise`` (Gaussian noise of σ nats on each), under the model's own
profile for the engine precision, calibrated first at the run shape given (the same shape the
certifies run at). Prints each run as docs/detection-power.md's raw-runs lines
(``DTYPE-calibrated-KIND-VALUE rc=N violated=...``), then one markdown row per precision.

    PYTHONPATH=. python tools/detection_grid.py smollm2 --work /tmp/grid --dtype float32 \\
        --bias 1e-7 1e-6 1e-5 --noise 3e-6 1e-5 3e-5 -- --max-prompt-len 64 --max-new-tokens 64 \\
        --max-batch 8

Reports and profiles stay under ``--work``; a rerun reuses them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ENGINES = {"bias": ("ConstantBias", "bias"), "noise": ("TokenNoise", "noise")}
#: run-shape flags calibrate takes too (the profile is measured at the shape it judges)
CAL_FLAGS = ("--max-batch", "--max-prompt-len", "--max-new-tokens")


def profile_for(model: Path, dtype: str, shape: list[str], work: Path) -> Path:
    """The model's own profile for ``dtype`` at ``shape``, calibrated once."""
    path = work / f"own-{dtype}.toml"
    if not path.is_file():
        caps = [a for f in CAL_FLAGS if f in shape for a in (f, shape[shape.index(f) + 1])]
        subprocess.run(
            [sys.executable, "-m", "conformance", "calibrate", "--model", str(model),
             "--engine-dtype", dtype, *caps, "--out", str(path)],
            check=True, capture_output=True,
        )  # fmt: skip
    return path


def run_once(
    model: Path, dtype: str, kind: str, value: str, profile: Path, shape: list[str], out: Path
) -> dict:
    """One certify of the broken engine at ``value``; its report.json."""
    engine, option = ENGINES[kind]
    if not (out / "report.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "conformance", "certify", "--model", str(model),
             "--engine", f"tests.support.engines:{engine}", "--engine-option",
             f"{option}={value}", "--engine-dtype", dtype, "--profile", str(profile),
             "--suite", "rollout_parity", *shape, "--out", str(out)],
            capture_output=True,
        )  # fmt: skip
    return json.loads((out / "report.json").read_text())


def violated(report: dict) -> list[str]:
    """The metrics the failing checks broke, sorted, once each."""
    return sorted(
        {v["metric"] for c in report["checks"] if c["status"] == "fail" for v in c["violations"]}
    )


def first_breach(report: dict) -> str:
    """The failing check's first violation, as a report writes it (``k1: |0.01| > 0.0068``)."""
    from conformance.metric_table import metric

    for check in report["checks"]:
        for v in check.get("violations", []) if check["status"] == "fail" else []:
            return f"{v['metric']}: {metric(v['metric']).relation(v['value'], v['threshold'])}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dtype", action="append", required=True)
    parser.add_argument("--bias", nargs="*", default=[])
    parser.add_argument("--noise", nargs="*", default=[])
    args, shape = parser.parse_known_args()
    shape = [a for a in shape if a != "--"]
    rows = []
    for dtype in args.dtype:
        (args.work / dtype).mkdir(parents=True, exist_ok=True)
        profile = profile_for(args.model, dtype, shape, args.work / dtype)
        caught: dict[str, tuple[str, str] | None] = {}
        for kind, values in (("bias", args.bias), ("noise", args.noise)):
            caught[kind] = None
            for value in sorted(values, key=float):
                name = f"{dtype}-calibrated-{kind}-{value}"
                report = run_once(
                    args.model, dtype, kind, value, profile, shape, args.work / dtype / name
                )
                broke = violated(report)
                rc = {"pass": 0, "fail": 1}.get(report["verdict"], 2)
                print(f"{name} rc={rc} violated={';'.join(broke) or '-'}", flush=True)
                if broke and caught[kind] is None:
                    caught[kind] = (value, f" ({first_breach(report)})")
        rows.append((dtype, caught))
    print("\n| engine precision | smallest bias δ detected | smallest noise σ detected |")
    print("|---|---|---|")
    for dtype, caught in rows:
        cells = [f"{c[0]}{c[1]}" if c else "none in the grid" for c in caught.values()]
        print(f"| {dtype} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
