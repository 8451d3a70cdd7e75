"""certificate.json: a small, storable record of which stack was certified against which profile.

A long RL run keeps the certificate; a later run compares its own stack against it
(``tim-conformance certify --check certificate.json``) to learn whether it still runs the
certified stack — same engine, backend, dtypes, model hash, versions, device and numerics env.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance import __version__
from conformance.errors import UsageError
from conformance.metric_table import worst_metrics
from conformance.report.schema import Report, load_report
from conformance.stack import VOLATILE_INFO

CERTIFICATE_SCHEMA = 1

#: stack fields that identify a checkout or a process rather than the numerics: a model moved
#: to another folder is the same model (its sha256 says so); a server's port or a rank's pid is
#: not a property of the stack. The fingerprint itself is recomputed from the rest, so it is
#: compared via them.
VOLATILE = (
    ("fingerprint",),
    ("model", "path"),
    *((info, key) for info in ("engine_info", "backend_info") for key in sorted(VOLATILE_INFO)),
)


@dataclass(frozen=True)
class CertificateCheck:
    """Result of comparing a stack against a certificate."""

    matches: bool
    #: (dotted field, certified value, current value) for every field that differs
    differences: list[tuple[str, object, object]] = field(default_factory=list)


def stable_stack(stack: Mapping[str, Any]) -> dict[str, Any]:
    """``stack`` without the ``VOLATILE`` fields (a deep copy; the input is left alone)."""
    stable = json.loads(json.dumps(stack))
    for path in VOLATILE:
        node = stable
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return stable


def build_certificate(
    report: Report, report_sha256: str, *, stack_args: list[str] | None = None
) -> dict[str, Any]:
    """The certificate for a report whose file's bytes hash to ``report_sha256``.

    Only a run of every suite certifies the stack: a passing run of some suites (the report's
    ``scope: "suites"``) is recorded with ``certified: false``, so that nothing that reads
    ``certified`` takes one property for the whole stack. A report from before ``scope`` reads
    as ``stack``. ``stack_args`` are the certify flags that rebuild the stack, which
    ``certify --check`` uses when it is given none.
    """
    scope = report.scope or "stack"
    return {
        "certificate_schema": CERTIFICATE_SCHEMA,
        "verdict": report.verdict,
        "certified": report.verdict == "pass" and scope == "stack",
        "scope": scope,
        "suites": list(report.suites()),
        "stack_args": stack_args,
        "fingerprint": report.stack["fingerprint"],
        "stack": stable_stack(report.stack),
        "profile": {
            "name": report.profile.name,
            "thresholds": report.profile.thresholds,
            "suites": report.profile.suites,
            "provenance": report.profile.provenance,
            "foreign": report.profile.foreign,
        },
        "seed": report.seed,
        "examples": report.examples,
        "created": report.created,
        "command": report.command,
        "metrics": {
            name: worst_metrics(c.metrics for c in checks)
            for name, checks in report.suites().items()
        },
        "report_sha256": report_sha256,
        "tim_conformance": __version__,
    }


def write_certificate(
    report_path: Path, out: Path, *, stack_args: list[str] | None = None
) -> dict[str, Any]:
    """Write ``out`` (certificate.json) for the report at ``report_path``; return its content."""
    report_path = Path(report_path)
    report = load_report(report_path)
    digest = hashlib.sha256(report_path.read_bytes()).hexdigest()
    certificate = build_certificate(report, digest, stack_args=stack_args)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(certificate, indent=2, sort_keys=True) + "\n", "utf-8")
    return certificate


def load_certificate(cert_path: Path) -> dict[str, Any]:
    """Read a certificate.json; a missing or malformed one is a one-line UsageError."""
    cert_path = Path(cert_path)
    try:
        certificate = json.loads(cert_path.read_text("utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"no certificate at {cert_path}", "pass the certificate.json certify wrote"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"cannot read certificate {cert_path}: {exc}", "pass a certificate.json"
        ) from None
    if (
        not isinstance(certificate, dict)
        or certificate.get("certificate_schema") != CERTIFICATE_SCHEMA
        or not isinstance(certificate.get("stack"), dict)
    ):
        raise UsageError(
            f"{cert_path} is not a tim-conformance certificate",
            "pass the certificate.json certify wrote",
        )
    return certificate


def certified_stack_args(certificate: Mapping[str, Any]) -> list[str]:
    """The certify flags of the stack a certificate names: those it recorded, or, for one
    written before it recorded them, its engine, backend, dtypes and logprobs kind."""
    if certificate.get("stack_args") is not None:
        return list(certificate["stack_args"])
    stack = certificate["stack"]
    flags = ("engine", "backend", "engine_dtype", "backend_dtype", "logprobs")
    return [a for f in flags if f in stack for a in (f"--{f.replace('_', '-')}", str(stack[f]))]


def check_certificate(cert_path: Path, stack: Mapping[str, Any]) -> CertificateCheck:
    """Compare the current ``stack`` (report.json's shape) with the certified one."""
    certified = _flatten(load_certificate(cert_path)["stack"])
    current = _flatten(stable_stack(stack))
    differences = [
        (key, certified.get(key), current.get(key))
        for key in sorted(certified.keys() | current.keys())
        if certified.get(key) != current.get(key)
    ]
    return CertificateCheck(matches=not differences, differences=differences)


def _flatten(node: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts as ``{"a.b.c": leaf}``; lists and scalars are leaves."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, object] = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat
