"""The wheel a user installs carries what certify runs: the suites (the clone's top-level
``suites/`` as the package ``conformance.suites``), every data file of the package, and the
entry points. Built for real from a copy of the tree, so no earlier in-tree build can lend it a
file; tox -e wheel installs such a wheel into a fresh env and certifies with it."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what a wheel is built from: the package, its suites and the packaging files
SOURCES = ("conformance", "suites", "pyproject.toml", "setup.py", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        source, target = REPO / name, work / "src" / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    build = ["pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist")]
    subprocess.run(
        [sys.executable, "-m", *build, str(work / "src")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (work / "dist").glob("tim_conformance-*.whl")
    return built


def _tree_files(folder: Path) -> set[str]:
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_wheel_carries_every_suite_and_package_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    suites = {f"conformance/suites/{f}" for f in _tree_files(REPO / "suites")}
    package = {f"conformance/{f}" for f in _tree_files(REPO / "conformance")}
    assert "conformance/suites/conftest.py" in suites
    assert any(f.endswith(".toml") for f in package) and any(f.endswith(".css") for f in package)
    assert not suites - names, "suites missing from the wheel"
    assert not package - names, "package files (profiles, report styles) missing from the wheel"


def test_wheel_declares_the_command_and_the_pytest_plugin(wheel):
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = (n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
    parsed = configparser.ConfigParser()
    parsed.read_string(archive.read(entry_points).decode())
    assert parsed["console_scripts"]["tim-conformance"] == "conformance.cli:main"
    assert parsed["pytest11"]["tim_conformance"] == "conformance.plugin"


def test_unpacked_wheel_finds_its_own_suites(wheel, tmp_path):
    """Outside a clone, certify's suites are the installed package's (a wheel is its
    site-packages layout zipped: unpacked on ``PYTHONPATH``, it is installed)."""
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    found = subprocess.run(
        [sys.executable, "-c", "import conformance.suites_location as s; print(s.suites_folder())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=120,
    )
    assert Path(found.stdout.strip()) == site / "conformance" / "suites"


def test_clone_finds_its_top_level_suites():
    from conformance.suites_location import suites_folder

    assert suites_folder() == REPO / "suites"


@pytest.mark.parametrize("installed", [True, False], ids=["wheel", "clone"])
def test_a_failure_replay_names_the_suite_file_from_where_the_run_started(
    wheel, tmp_path, monkeypatch, installed
):
    """certify runs pytest with its rootdir at the suites' parent: a wheel's node ids are then
    relative to the installed package, where the user is not; the replay names a file they can
    run, and in a clone run from its root stays ``suites/…`` as before."""
    from conformance.session import HarnessSession
    from conformance.stack import StackSpec

    if installed:
        zipfile.ZipFile(wheel).extractall(tmp_path / "site-packages")
        rootdir, started = tmp_path / "site-packages" / "conformance", tmp_path / "project"
        started.mkdir()
    else:
        rootdir = started = REPO
    monkeypatch.chdir(started)
    session = HarnessSession(StackSpec(), seed=7, report_dir=None, command="", rootdir=rootdir)
    nodeid = "suites/test_prefill_parity.py::test_prefill_parity"
    command = shlex.split(session.replay_command(nodeid))
    target, test = command[1].split("::")
    assert (started / target).resolve() == (rootdir / "suites/test_prefill_parity.py").resolve()
    assert (started / target).is_file() and test == "test_prefill_parity"
    assert Path(target).is_absolute() == installed
    assert command[0] == "pytest" and "--hypothesis-seed=7" in command
