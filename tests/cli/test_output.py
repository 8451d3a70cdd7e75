"""What ``certify`` leaves on the terminal and in the folder it started from: a failing run's
verdict on one screen (each failed check's metric, value, bound, shrunk case and replay command;
no traceback, which goes to ``pytest.log`` in the report folder), the "newer than tested"
warning once, and no ``.hypothesis/`` or ``.benchmarks/`` in the user's folder."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.certify_runs import ENGINES, VARIANT_EXAMPLES

from conformance.models.cache import cache_root
from conformance.releases import ReleaseRange, check_stack

#: a terminal screen: the verdict of a stack failing 7 checks must fit it
SCREEN_LINES = 120
#: a breach as the verdict writes it: ``abs_diff_max = 1.24 > 0.67``
BREACH = re.compile(r"\w+ = \S+ [<>] \S+")


def _certify(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """certify started from ``cwd`` (an empty folder: where a user runs it), as a user does."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "conformance", "certify", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=1800,
    )  # fmt: skip


@pytest.mark.slow
def test_a_not_certified_verdict_fits_one_screen_and_leaves_the_users_folder_clean(
    tmp_path, cli_env
):
    out, cwd = tmp_path / "run", tmp_path / "cwd"
    # per-token noise of 0.01 nats fails 8 checks at 5 examples a property
    result = _certify(
        "--engine", ENGINES + "TokenNoise", *VARIANT_EXAMPLES, "--out", str(out),
        env=cli_env, cwd=cwd,
    )  # fmt: skip
    screen = result.stdout + result.stderr
    assert result.returncode == 1, screen[-3000:]
    lines = screen.splitlines()
    assert "Traceback" not in screen and not any(line.startswith("E ") for line in lines)
    assert len(lines) <= SCREEN_LINES, screen
    failed = [i for i, line in enumerate(lines) if line.startswith("FAIL ")]
    assert len(failed) >= 7, screen
    for at in failed:
        block = lines[at : next((i for i in failed if i > at), len(lines))]
        # metric, value and bound: the failing case's in the message, every example's below
        assert BREACH.search(block[0]) or any("bounds broken:" in line for line in block), block
        assert any(line.startswith("  case: ") for line in block), block
        (replay,) = [line for line in block if line.startswith("  replay: pytest ")]
        assert "--hypothesis-seed=" in replay
    assert len([line for line in lines if "is newer than" in line]) <= 1, screen
    log = (out / "pytest.log").read_text()
    # pytest's whole failure output: the assertion lines and the frames they were raised in
    assert re.search(r"^E +", log, re.MULTILINE) and "recorder.py" in log
    assert sorted(p.name for p in cwd.iterdir()) == []
    # Hypothesis's files (the constants it collects from the code under test) in the cache
    assert any((cache_root() / "hypothesis").rglob("*"))


@pytest.mark.slow
def test_verbose_shows_pytests_output_and_still_logs_it(tmp_path, cli_env):
    out = tmp_path / "run"
    result = _certify(
        "--engine", ENGINES + "ProcessedLogprobs", "--suite", "logprob_semantics",
        "--examples", "2", "--shrink-seconds", "5", "-v", "--out", str(out),
        env=cli_env, cwd=tmp_path / "cwd",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    shown = result.stdout + result.stderr
    assert re.search(r"^E +", shown, re.MULTILINE) and "PropertyFailure" in shown
    assert "PropertyFailure" in (out / "pytest.log").read_text()
    # the verdict once: pytest's summary shows it, certify adds only its last lines
    assert shown.count("verdict: NOT CERTIFIED") == 1, shown[-3000:]


def test_a_stack_on_one_newer_install_warns_in_one_line_naming_both() -> None:
    installed = importlib.metadata.version("pytest")
    tested = ReleaseRange("pytest", min="0.1", max_tested="0.1")
    line = check_stack({"engine 'e'": tested, "backend 'b'": tested})
    assert line == (
        f"pytest {installed} is newer than engine 'e' and backend 'b' were tested on "
        "(pytest 0.1); running, report.json records it"
    )
    assert check_stack({"engine 'e'": tested, "backend 'b'": None}) == (
        f"pytest {installed} is newer than engine 'e' was tested on (pytest 0.1); running, "
        "report.json records it"
    )
    assert check_stack({"engine 'e'": None, "backend 'b'": None}) is None
