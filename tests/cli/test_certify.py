"""``tim-conformance certify`` end to end, as a user runs it (a subprocess, real stack)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from report.reports import make_report

from conformance.metric_table import metric

FAST = ["--examples", "4"]
REPO = Path(__file__).resolve().parents[2]


def certify(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conformance", "certify", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=900,
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_report_left_in_the_folder_is_not_the_verdict_of_a_run_whose_suites_never_ran(
    tmp_path, cli_env
):
    """A passing report an earlier run left in ``--out`` is not this run's: where pytest stops
    before the plugin writes one (a suites conftest that raises), certify says the suites did
    not run, writes no certificate, and leaves no report to be read as this run's."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "conftest.py").write_text('raise RuntimeError("a broken conftest")\n')
    (suites / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    out = tmp_path / "run"
    out.mkdir()
    earlier = make_report()
    assert earlier.verdict == "pass"
    (out / "report.json").write_text(json.dumps(earlier.to_json()))
    line = _one_line_error(
        certify("--suites", str(suites), "--out", str(out), env=cli_env, cwd=tmp_path)
    )
    assert (
        "the suites did not run" in line and "a broken conftest" in (out / "pytest.log").read_text()
    )
    assert not (out / "report.json").exists() and not (out / "certificate.json").exists()


def test_default_stack_is_certified(tmp_path, cli_env):
    out = tmp_path / "run"
    result = certify("--out", str(out), env=cli_env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass"
    assert report["seed"] == 0
    assert report["profile"]["name"] == "fp32"
    suites = {c["suite"] for c in report["checks"]}
    assert {"prefill_parity", "rollout_parity", "batch_invariance", "decode_vs_prefill"} <= suites
    assert all(c["status"] in ("pass", "skip") for c in report["checks"])
    measured = [c for c in report["checks"] if c["status"] == "pass"]
    # the log-prob properties (Hypothesis-drawn), and the plain tests that measure other things
    compared = [c for c in measured if "abs_diff_max" in c["metrics"]]
    assert all(c["examples_run"] > 0 and c["metrics"]["abs_diff_max"] < 1e-3 for c in compared)
    sampler = [c for c in measured if c["suite"] == "sampler_fidelity"]
    # one test per spec: the four single dimensions and the three filtered specs RL samples
    # with (hf-generate takes min-p)
    assert len(sampler) == 7 and all(c["metrics"]["sampler_p_value"] >= 2.5e-4 for c in sampler)
    # the support property counted every filtered spec's tokens, none outside: rollout
    # parity's batches where seeded determinism sampled them, the engine answering once
    events = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    shared = [e for e in events if e["event"] == "shared_answer" and e["method"] == "generate"]
    assert shared and all(
        "rollout_parity" in e["nodeid"] and "seeded_sampling" in e["asked_by"] for e in shared
    )
    audited = [c["metrics"] for c in measured if "support_tokens" in c["metrics"]]
    assert {"sampler_fidelity", "determinism"} <= {
        c["suite"] for c in measured if "support_tokens" in c["metrics"]
    }
    assert all(m["support_tokens"] > 0 and m["out_of_support_tokens"] == 0 for m in audited)
    # streamed as it ran: one measurement line per example, then a check line per test
    assert sum(e["event"] == "measurement" for e in events) >= sum(
        c["examples_run"] for c in report["checks"]
    )
    assert (out / "report.html").is_file()
    # a run of every suite certifies the stack, and its certificate lists them
    certificate = json.loads((out / "certificate.json").read_text())
    assert certificate["certified"] is True and certificate["scope"] == "stack"
    suites = sorted(p.stem.removeprefix("test_") for p in (REPO / "suites").glob("test_*.py"))
    assert sorted(certificate["suites"]) == suites
    # every distinct skip reason reaches the terminal (the summary once listed 3)
    reasons = {c["message"] for c in report["checks"] if c["status"] == "skip"}
    assert len(reasons) > 3 and all(reason in result.stdout for reason in reasons), reasons


def test_a_sound_stack_passes_even_one_example(tmp_path, cli_env):
    """One drawn example is the minimal case, a token or two, whose mean ρ is one token's ρ:
    held to pooled bounds calibrated on ≥ 256 tokens, it failed a sound stack (k1, rho_mean,
    chi2_token, pcc). Every check now also pools the example at the top sizes."""
    out = tmp_path / "run"
    result = certify("--examples", "1", "--out", str(out), env=cli_env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    measured = [c for c in report["checks"] if c["status"] == "pass"]
    properties = [c for c in measured if "abs_diff_max" in c["metrics"]]
    assert properties and all(not c["violations"] for c in measured)
    # group_sampling's one case is fixed, not drawn: it has no example at the top sizes
    drawn = [c for c in properties if c["suite"] != "group_sampling"]
    assert drawn and all(c["examples_run"] >= 2 for c in drawn)


def test_bf16_engine_fails_the_fp32_profile(tmp_path, cli_env):
    out = tmp_path / "run"
    result = certify(
        "--engine-dtype", "bfloat16", "--profile", "fp32", "--out", str(out), *FAST,
        env=cli_env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail"
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert any(c["suite"] == "rollout_parity" for c in failed)
    for check in failed:
        assert check["violations"], check
        for v in check["violations"]:
            assert metric(v["metric"]).violates(v["value"], v["threshold"]), v
        assert any(f"{v['metric']} = " in check["message"] for v in check["violations"])
        assert (
            check["worst_case"]["prompt_ids"]
            and "--hypothesis-seed" in (check["worst_case"]["replay"])
        )


def test_engine_dying_mid_run_keeps_measurements_and_is_incomplete(tmp_path, cli_env):
    out = tmp_path / "run"
    env = {**cli_env, "TIM_TEST_CALLS_BEFORE_DEATH": "6"}
    result = certify(
        "--engine", "tests.support.crashing_engine:DyingEngine", "--out", str(out), *FAST,
        env=env, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    error = _one_line_error(result)
    assert "incomplete" in error and "results.jsonl" in error
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "incomplete"
    assert "simulated death" in report["reason"]
    events = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "measurement" for e in events) >= 1
    assert any(e["event"] == "crash" for e in events)


def test_tokenizer_vocab_mismatch_is_one_line(tmp_path, cli_env, default_model):
    broken = tmp_path / "model"
    broken.mkdir()
    for item in default_model.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    config["vocab_size"] = 100
    (broken / "config.json").write_text(json.dumps(config))
    line = _one_line_error(certify("--model", str(broken), env=cli_env, cwd=tmp_path))
    assert "vocab" in line


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_missing_engine_package_is_one_line(tmp_path, cli_env):
    line = _one_line_error(certify("--engine", "vllm", env=cli_env, cwd=tmp_path))
    assert "vllm" in line and "pip install" in line


#: certify run in a subprocess with the spec's constructor and its preflight counted (each still
#: the real one)
_COUNTED_CERTIFY = """
import collections, sys
import conformance.preflight
from conformance.stack import StackSpec
calls = collections.Counter()
built, checked = StackSpec.from_options.__func__, conformance.preflight.preflight
def from_options(cls, *args, **kwargs):
    calls["from_options"] += 1
    return built(cls, *args, **kwargs)
def preflight(spec, **kwargs):
    calls["preflight"] += 1
    return checked(spec, **kwargs)
StackSpec.from_options, conformance.preflight.preflight = classmethod(from_options), preflight
from conformance.cli import main
sys.argv = ["tim-conformance", "certify", *sys.argv[1:]]
code = main(sys.argv[1:])
print("calls", dict(calls), "exit", code)
"""


def test_certify_builds_and_preflights_the_spec_once(tmp_path, cli_env):
    """The spec certify builds reaches the plugin as it is: not rebuilt from flags there, nor
    preflighted (a profile decision, perhaps a calibration) a second time."""
    args = ["--examples", "2", "--suite", "prefill_parity", "--out", str(tmp_path / "run")]
    result = subprocess.run(
        [sys.executable, "-c", _COUNTED_CERTIFY, *args],
        capture_output=True,
        text=True,
        env=cli_env,
        cwd=tmp_path,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "calls {'from_options': 1, 'preflight': 1} exit 0" in result.stdout, result.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    # the report records certify's own command, which names what was run
    assert report["command"].startswith("tim-conformance certify --examples 2")
