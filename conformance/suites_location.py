"""Where the conformance suites are, for a clone and for an installed wheel alike.

The repository keeps its suites in the top-level ``suites/`` folder (``pytest suites/`` from a
clone); setup.py maps that folder into the wheel as the package ``conformance.suites``
(``pytest --pyargs conformance.suites`` once installed). This module is the one place that
decides which of the two a run uses.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import conformance
from conformance.errors import UsageError

#: the package the suites are installed as
SUITES_PACKAGE = "conformance.suites"


def suites_folder() -> Path:
    """The folder of the suites ``certify`` runs by default.

    A clone (the package imported from it, editable or on ``PYTHONPATH``): its own top-level
    ``suites/`` — checked first, because importlib alone could answer with another clone's
    folder, where an editable install of that one maps ``conformance.suites``. Installed from a
    wheel: the package ``conformance.suites``, found by importlib.
    """
    clone = Path(conformance.__file__).resolve().parents[1]
    if (clone / "pyproject.toml").is_file() and (clone / "suites" / "conftest.py").is_file():
        return clone / "suites"
    spec = importlib.util.find_spec(SUITES_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    raise UsageError(
        f"the conformance suites are not installed (no package {SUITES_PACKAGE} next to "
        f"{Path(conformance.__file__).parent})",
        "reinstall tim-conformance from its wheel or a clone (`pip install .`), or pass "
        "--suites DIR",
    )


def shipped_suites() -> frozenset[str]:
    """The names of the suites the harness ships (``test_NAME.py`` in :func:`suites_folder`):
    the ones a run must have run to certify a whole stack."""
    return frozenset(p.stem.removeprefix("test_") for p in suites_folder().glob("test_*.py"))


def suite_paths(folder: Path, names: list[str]) -> list[Path]:
    """The suite files a run runs: all of ``folder``, or the ones ``names`` (``--suite``)
    name; a folder that is not one, or a name no suite has, is one UsageError line."""
    if not folder.is_dir():
        raise UsageError(
            f"suites folder {folder} not found",
            "pass --suites an existing folder, or leave it out to run the installed suites",
        )
    if not names:
        return [folder]
    available = sorted(p.stem.removeprefix("test_") for p in folder.glob("test_*.py"))
    unknown = [n for n in names if n not in available]
    if unknown:
        raise UsageError(
            f"unknown suite(s) {', '.join(unknown)}", f"choose from: {', '.join(available)}"
        )
    return [folder / f"test_{n}.py" for n in dict.fromkeys(names)]
