"""Knob bisection with a control: before a failing knob variant is taken apart, its case runs on
the unmodified engine; a defect the engine already has is reported on the engine, not a knob."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_batching_defect_under_an_ignored_knob_is_the_engines_not_the_knobs(tmp_path, cli_env):
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable, "-m", "conformance", "certify", "--examples", "4", "--out", str(out),
            "--engine", "tests.support.byoe_engines:IgnoredKnobBatchingDefect",
            "--suite", "rollout_parity", "--suite", "engine_knobs",
        ],
        capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    failed = {c["suite"]: c for c in report["checks"] if c["status"] == "fail"}
    # the engine's own suite catches the defect
    assert "abs_diff_max" in failed["rollout_parity"]["message"]
    knob = failed["engine_knobs"]
    assert "max_batch_size=1 changes logprobs" not in knob["message"]
    assert "the engine itself, no knob changed, fails this case" in knob["message"]
    # its case is the engine's, with no knob held
    assert knob["worst_case"]["knobs"] == {} and knob["worst_case"]["prompt_ids"]
    # no part of the variant was started to bisect it: the control settled it
    starts = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    changes = [e["changes"] for e in starts if e["event"] == "engine_started"]
    assert changes == [{}, {"max_batch_size": "1"}]
