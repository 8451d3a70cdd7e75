"""The pytest plugin as users drive it: seeds recorded and honoured, user-written suites."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

USER_SUITE = """
from hypothesis import given, strategies as st

from conformance.strategies import sampling_specs, token_sequences


@given(data=st.data())
def test_low_temperature_rollouts(data, engine, backend, model, recorder):
    prompt = data.draw(token_sequences(model.vocab_size, max_len=16))
    spec = data.draw(sampling_specs(temperature=0.5, max_new_tokens=4))
    recorder.case([prompt], sampling=spec)
    (completion,) = engine.generate([prompt], spec)
    lp_train = backend.recompute([completion.sequence]).logprobs[0][len(prompt) - 1 :]
    recorder.check_profile(recorder.measure([lp_train], [completion.logprobs]))
"""


def run_pytest(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
    )


def test_hypothesis_seed_is_recorded_and_reproduces_every_number(tmp_path, cli_env):
    """The same seed gives the same numbers, on a CI machine too: with ``CI`` set Hypothesis
    loads its ``ci`` profile, whose ``derandomize`` would replace the seed the report records."""
    reports = []
    for run, env in (("a", cli_env), ("b", {**cli_env, "CI": "true"})):
        out = tmp_path / run
        result = run_pytest(
            str(REPO / "suites" / "test_rollout_parity.py"),
            "--tim-examples", "3", "--hypothesis-seed", "123", "--tim-report", str(out),
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:]
        reports.append(json.loads((out / "report.json").read_text()))
    first, second = reports
    assert first["seed"] == second["seed"] == 123
    assert first["checks"][0]["metrics"] == second["checks"][0]["metrics"]
    assert first["checks"][0]["worst_case"] == second["checks"][0]["worst_case"]


def test_a_run_with_suites_deselected_is_not_a_certificate(tmp_path, cli_env):
    """pytest's own selection (-k here) limits what a pass covers, as certify --suite does."""
    out = tmp_path / "run"
    result = run_pytest(
        str(REPO / "suites"), "-k", "test_rollout_parity", "--tim-examples", "2",
        "--tim-report", str(out), cwd=tmp_path, env=cli_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:]
    assert "verdict: PASSED — on suite(s) rollout_parity only" in result.stdout
    assert "CERTIFIED" not in result.stdout
    assert json.loads((out / "report.json").read_text())["scope"] == "suites"
    assert "PASSED" in (out / "report.html").read_text()


def test_a_folder_with_some_of_the_shipped_suites_is_not_a_certificate(tmp_path, cli_env):
    """Every suite file of one's own folder ran, but not every suite the harness ships: a pass
    certifies those suites only."""
    own = tmp_path / "own_suites"
    own.mkdir()
    for name in ("conftest.py", "test_rollout_parity.py"):
        (own / name).write_text((REPO / "suites" / name).read_text())
    out = tmp_path / "run"
    result = run_pytest(
        str(own), "--tim-examples", "2", "--tim-report", str(out), cwd=tmp_path, env=cli_env
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert "verdict: PASSED — on suite(s) rollout_parity only" in result.stdout
    assert json.loads((out / "report.json").read_text())["scope"] == "suites"


@pytest.mark.parametrize(
    ("configuration", "flags"),
    [
        ({}, ["--tim-examples", "3", "--tim-report", "report"]),
        ({"pytest.ini": "[pytest]\ntim_examples = 3\ntim_report = report\n"}, []),
        ({"pyproject.toml": '[tool.tim-conformance]\nexamples = 3\nreport = "report"\n'}, []),
    ],
    ids=["flags", "ini", "pyproject"],
)
def test_user_written_suite_runs_with_options_from_any_source(
    tmp_path, cli_env, configuration, flags
):
    (tmp_path / "test_my_suite.py").write_text(USER_SUITE)
    for name, text in configuration.items():
        (tmp_path / name).write_text(text)
    result = run_pytest("test_my_suite.py", *flags, cwd=tmp_path, env=cli_env)
    assert result.returncode == 0, result.stdout[-2000:]
    # one suite of one's own, without the shipped ones, certifies that suite, not the stack
    assert "verdict: PASSED — on suite(s) my_suite only" in result.stdout
    (check,) = json.loads((tmp_path / "report" / "report.json").read_text())["checks"]
    assert check["suite"] == "my_suite" and check["status"] == "pass"
    assert check["examples_run"] == 3 + 1  # drawn, and one at the top sizes


def test_a_pool_smaller_than_the_profile_was_calibrated_on_is_reported_not_judged(
    tmp_path, cli_env
):
    """The user suite samples at most 4 tokens an example: its pool stays below the 256 tokens
    fp32's pooled bounds were calibrated on, so those bounds are not judged, and it says so."""
    (tmp_path / "test_my_suite.py").write_text(USER_SUITE)
    result = run_pytest(
        "test_my_suite.py", "--tim-examples", "3", "--tim-report", "report",
        cwd=tmp_path, env=cli_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (check,) = report["checks"]
    assert 0 < check["tokens"] < report["profile"]["min_pooled_tokens"] == 256
    assert check["message"].startswith("pooled bounds not judged"), check["message"]
    assert check["violations"] == []


def test_an_unconfigured_run_of_a_user_suite_is_one_usage_line(tmp_path, cli_env):
    (tmp_path / "test_my_suite.py").write_text(USER_SUITE)
    result = run_pytest("test_my_suite.py", cwd=tmp_path, env=cli_env)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert "no tim-conformance option is set" in line and "--tim-engine" in line
