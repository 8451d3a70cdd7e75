"""certificate.json: a small, storable record of which stack was certified against which profile.

A long RL run keeps the certificate; a launcher checks it
(``tim-conformance check certificate.json``) before it starts the run: the run may go
only on a certificate that certifies the stack (a full run's pass), that no one edited (its
fingerprint recomputed from its stack, its fields against the report beside it, its signature
where ``TIM_CERT_KEY`` is set) and whose stack is today's — same engine, backend, dtypes, model
hash, versions, device, threads and numerics env.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conformance import __version__
from conformance.env import CERT_KEY
from conformance.errors import UsageError
from conformance.fingerprint import VOLATILE_INFO, stack_fingerprint
from conformance.metric_table import worst_metrics
from conformance.options import JUDGED_OPTIONS, PROFILE, RUN_SHAPE_OPTIONS, STACK_OPTIONS, flags
from conformance.profiles import load_profile
from conformance.report.schema import Report, load_report
from conformance.stack import StackSpec

CERTIFICATE_SCHEMA = 1
#: how ``signature`` starts: the MAC it holds, in case another ever joins it
SIGNATURE_PREFIX = "hmac-sha256:"
#: fields a certificate rebuilt from its report need not share with it: the signature is over
#: the rest, and the harness's version is the one that wrote it (the stack records it too)
_NOT_FROM_REPORT = ("signature", "tim_conformance")
#: fields a report from before it recorded the stack's options cannot rebuild (certify gave
#: them; the stack they give is held to the certified one by ``check`` all the same)
_SPEC_FIELDS = ("spec", "stack_args")

#: stack fields that identify a checkout or a process rather than the numerics: a model moved
#: to another folder is the same model (its sha256 says so); a server's port or a rank's pid is
#: not a property of the stack. The fingerprint itself is recomputed from the rest, so it is
#: compared via them.
VOLATILE = (
    ("fingerprint",),
    ("model", "path"),
    # one venv's interpreter is `python` run as `python -m conformance` and `python3.11` behind
    # the `tim-conformance` script; the packages it runs are recorded by version
    ("python_executable",),
    *((info, key) for info in ("engine_info", "backend_info") for key in sorted(VOLATILE_INFO)),
)


@dataclass(frozen=True)
class CertificateCheck:
    """Result of comparing a stack against a certificate."""

    matches: bool
    #: (dotted field, certified value, current value) for every field that differs
    differences: list[tuple[str, object, object]] = field(default_factory=list)


@dataclass(frozen=True)
class LaunchVerdict:
    """What ``tim-conformance check`` concludes: whether a run may start on a certificate."""

    #: the certificate judged
    path: Path
    #: one line per reason it may not (none: it may), the stack's differences last
    reasons: list[str]
    #: what was checked or left unchecked beyond the reasons, one line each (the signature)
    notes: list[str]
    #: the current stack held to the certified one; None where the certificate alone refused
    #: the launch, its stack neither built nor started
    stack: CertificateCheck | None = None
    #: the values the launch names of the options a run is judged at, held to the certified
    #: ones; None where the certificate alone refused the launch
    values: CertificateCheck | None = None

    @property
    def certifies(self) -> bool:
        return not self.reasons

    def with_stack(self, check: CertificateCheck, values: CertificateCheck) -> LaunchVerdict:
        """This verdict of the certificate alone, with the current stack held to the certified
        one (``check``, :func:`compare_stacks`'s) and the values the launch names to the
        certified ones (``values``, :func:`compare_values`'s)."""
        differ = ", ".join(key for key, _, _ in values.differences)
        changed = ", ".join(key for key, _, _ in check.differences)
        reasons = [
            *self.reasons,
            *([f"the launch's values differ from the certified ones: {differ}"] if differ else []),
            *([f"the stack changed since it was certified: {changed}"] if changed else []),
        ]
        return replace(self, reasons=reasons, stack=check, values=values)

    @property
    def lines(self) -> list[str]:
        """What ``tim-conformance check`` says of it, a line each: the verdict for the launch (one
        line per reason it may not start), each field the stack changed in, the notes."""
        said = [f"NOT CERTIFIED for this launch: {reason}" for reason in self.reasons] or [
            f"CERTIFIED for this launch: the current stack is the one certified in {self.path}"
        ]
        differences = [
            *(self.values.differences if self.values is not None else []),
            *(self.stack.differences if self.stack is not None else []),
        ]
        changed = [
            f"  {key}: certified {certified!r}, now {current!r}"
            for key, certified, current in differences
        ]
        notes = [f"tim-conformance: {note}" for note in self.notes]
        return [*(f"tim-conformance: {line}" for line in said), *changed, *notes]


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


def build_certificate(report: Report, report_sha256: str) -> dict[str, Any]:
    """The certificate for a report whose file's bytes hash to ``report_sha256``.

    Only a run of every suite certifies the stack: a passing run of some suites (the report's
    ``scope: "suites"``) is recorded with ``certified: false``, so that nothing that reads
    ``certified`` takes one property for the whole stack. A report from before ``scope`` reads
    as ``stack``. ``spec`` is the report's: the stack's option values as the command line
    spells them, from which ``tim-conformance check`` given no stack option rebuilds the certified
    stack; ``stack_args`` (deprecated: read for certificates written before ``spec``) renders
    them as certify's flags.
    """
    scope = report.scope or "stack"
    return {
        "certificate_schema": CERTIFICATE_SCHEMA,
        "verdict": report.verdict,
        "certified": report.verdict == "pass" and scope == "stack",
        "scope": scope,
        "suites": list(report.suites()),
        "spec": report.spec,
        "stack_args": None if report.spec is None else flags(report.spec, prefix=""),
        "fingerprint": report.stack["fingerprint"],
        "stack": stable_stack(report.stack),
        "profile": {
            "name": report.profile.name,
            "thresholds": report.profile.thresholds,
            "suites": report.profile.suites,
            "provenance": report.profile.provenance,
            "foreign": report.profile.foreign,
        },
        "run_shape": report.run_shape,
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


def write_certificate(report_path: Path, out: Path) -> dict[str, Any]:
    """Write ``out`` (certificate.json) for the report at ``report_path``, signed where
    ``TIM_CERT_KEY`` is set; return its content."""
    report_path = Path(report_path)
    report = load_report(report_path)
    digest = hashlib.sha256(report_path.read_bytes()).hexdigest()
    certificate = build_certificate(report, digest)
    key = CERT_KEY.get()
    if key:
        certificate["signature"] = sign(certificate, key)
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


def certified_values(certificate: Mapping[str, Any]) -> dict[str, Any]:
    """The option values of the stack a certificate names, keyed by option name, for
    :func:`conformance.options.resolve`: its ``spec``; for one written before it, its
    ``stack_args`` (deprecated); for one written before those, its stack's engine, backend,
    dtypes and logprobs kind."""
    if isinstance(certificate.get("spec"), dict):
        return dict(certificate["spec"])
    if isinstance(certificate.get("stack_args"), list):
        return _flag_values([str(arg) for arg in certificate["stack_args"]])
    stack = certificate["stack"]
    named = ("engine", "backend", "engine_dtype", "backend_dtype", "logprobs")
    return {name.replace("_", "-"): str(stack[name]) for name in named if name in stack}


def _flag_values(args: list[str]) -> dict[str, str | list[str]]:
    """The option values certify's flags (``--NAME VALUE``, as ``stack_args`` holds them)
    give, keyed by name."""
    multiple = {o.name for o in STACK_OPTIONS if o.multiple}
    values: dict[str, str | list[str]] = {}
    for flag, value in zip(args[::2], args[1::2], strict=False):
        name = flag.removeprefix("--")
        values[name] = [*values.get(name, []), value] if name in multiple else value
    return values


def judge_certificate(certificate: Mapping[str, Any], *, path: Path) -> LaunchVerdict:
    """Whether a run may start on ``certificate`` (:func:`load_certificate`'s, of ``path``),
    judged on its own, before any of its values is used: it must certify a stack and be
    untouched (signature, fingerprint, the report.json beside it). Whether it names the
    current stack is :meth:`LaunchVerdict.with_stack`'s, once that stack started."""
    signature_reasons, notes = _signature_check(certificate, CERT_KEY.get())
    # what the certified run concluded, then whether the certificate still says what it wrote
    reasons = [
        *_not_certified(certificate),
        *signature_reasons,
        *_edited_fields(certificate, path.parent / "report.json"),
    ]
    return LaunchVerdict(path, reasons, notes)


def sign(certificate: Mapping[str, Any], key: str) -> str:
    """The ``signature`` of ``certificate`` under ``key``: an HMAC-SHA256 of its canonical JSON
    (sorted keys, compact separators) without the signature itself."""
    unsigned = {k: v for k, v in certificate.items() if k != "signature"}
    canonical = json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()
    return SIGNATURE_PREFIX + hmac.new(key.encode(), canonical, hashlib.sha256).hexdigest()


def _signature_check(
    certificate: Mapping[str, Any], key: str | None
) -> tuple[list[str], list[str]]:
    """(reasons, notes) about the certificate's signature: with no key only a note that a
    signature went unverified; with one, a reason for a missing or wrong signature."""
    signature = certificate.get("signature")
    if key is None:
        unverified = f"signature not verified ({CERT_KEY.name} not set)"
        return [], [unverified] if signature is not None else []
    if signature is None:
        return [
            f"the certificate is not signed, and {CERT_KEY.name} is set: only a certificate "
            "certify signed with that key is accepted"
        ], []
    if not hmac.compare_digest(str(signature).encode(), sign(certificate, key).encode()):
        return [
            f"certificate field 'signature' does not verify with {CERT_KEY.name}: the "
            "certificate was edited after it was signed, or signed with another key"
        ], []
    return [], [f"signature verified with {CERT_KEY.name}"]


def _edited_fields(certificate: Mapping[str, Any], report_path: Path) -> list[str]:
    """One line per field shown edited: against the report beside the certificate where it is
    the one certified (its sha256), and the fingerprint and ``certified`` against the rest of
    the certificate itself."""
    named: list[str] = []
    reasons = []
    if report_path.is_file():
        data = report_path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != certificate.get("report_sha256"):
            reasons.append(
                f"certificate field 'report_sha256' does not match the {report_path} beside it "
                f"(which hashes to {digest[:16]}…): the report or that field was edited"
            )
        else:
            rebuilt = build_certificate(load_report(report_path), digest)
            for key, says, reported in _flat_differences(certificate, rebuilt):
                named.append(key)
                reasons.append(
                    f"certificate field '{key}' was edited: it says {_short(says)}, "
                    f"its report.json {_short(reported)}"
                )
    recorded = certificate.get("fingerprint")
    recomputed = _recomputed_fingerprint(certificate["stack"])
    if recomputed != recorded and not any(
        k == "fingerprint" or k.startswith("stack.") for k in named
    ):
        reasons.append(
            f"certificate field 'fingerprint' was edited (or its 'stack'): {_short(recorded)} "
            f"is not the hash of the stack it records ({recomputed or 'a stack cut short'})"
        )
    verdict, scope = certificate.get("verdict"), certificate.get("scope", "stack")
    certifies = verdict == "pass" and scope == "stack"
    if certificate.get("certified") is not certifies and not {
        "certified",
        "verdict",
        "scope",
    } & set(named):
        reasons.append(
            f"certificate field 'certified' was edited (or 'verdict' or 'scope'): it says "
            f"{_short(certificate.get('certified'))}, but verdict {verdict!r} over scope "
            f"{scope!r} {'certifies' if certifies else 'does not certify'}"
        )
    return reasons


def _not_certified(certificate: Mapping[str, Any]) -> list[str]:
    """One line per reason the certified run certifies no stack."""
    verdict, scope = certificate.get("verdict"), certificate.get("scope", "stack")
    reasons = []
    if verdict == "fail":
        reasons.append("its run was not certified: verdict NOT CERTIFIED")
    elif verdict == "incomplete":
        reasons.append(
            "its run was not certified: it did not finish (verdict incomplete: interrupted, "
            "or a component failed)"
        )
    elif verdict != "pass":
        reasons.append(f"its run was not certified: verdict {verdict!r}")
    if scope != "stack":
        suites = ", ".join(map(str, certificate.get("suites") or [])) or "?"
        reasons.append(
            f"scoped to suite(s) {suites}: a --suite run is no certificate of the stack "
            "(certify without --suite)"
        )
    return reasons


def _recomputed_fingerprint(stack: Mapping[str, Any]) -> str | None:
    """The fingerprint of a certificate's stack; None for one without the parts it hashes."""
    if not all(isinstance(stack.get(k), dict) for k in ("model", "engine_info", "backend_info")):
        return None
    return stack_fingerprint(stack)


def _flat_differences(
    certificate: Mapping[str, Any], rebuilt: Mapping[str, Any]
) -> list[tuple[str, object, object]]:
    """(dotted field, certificate's value, rebuilt value) for every field of the certificate
    that differs, as JSON with sorted keys (a NaN metric equals itself; a list's tables compare
    as tables). A field the certificate lacks is one an older harness did not write."""
    unbuilt = _NOT_FROM_REPORT + (_SPEC_FIELDS if rebuilt.get("spec") is None else ())
    compared = [k for k in certificate if k not in unbuilt]
    said = _flatten({k: certificate[k] for k in compared})
    built = _flatten({k: rebuilt.get(k) for k in compared})
    return [
        (key, said.get(key), built.get(key))
        for key in sorted(said.keys() | built.keys())
        if json.dumps(said.get(key), sort_keys=True) != json.dumps(built.get(key), sort_keys=True)
    ]


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compare_stacks(certificate: Mapping[str, Any], stack: Mapping[str, Any]) -> CertificateCheck:
    """The current ``stack`` (report.json's shape) against the one ``certificate`` certified,
    the ``VOLATILE`` fields left out."""
    certified = _flatten(certificate["stack"])
    current = _flatten(stable_stack(stack))
    differences = [
        (key, certified.get(key), current.get(key))
        for key in sorted(certified.keys() | current.keys())
        if certified.get(key) != current.get(key)
    ]
    return CertificateCheck(matches=not differences, differences=differences)


#: a value a certificate from before the field was written does not record
_UNRECORDED = "not recorded"


def compare_values(
    certificate: Mapping[str, Any], spec: StackSpec, started: Mapping[str, Any]
) -> CertificateCheck:
    """The launch's values its stack's fingerprint does not show against the ones
    ``certificate`` was certified at: the engine options it starts with that the started
    engine does not report (``started``, the stack as report.json records it: an option its
    ``engine_info`` names, at its top level or among its ``knobs``, is held there, by the value
    in effect), and the values it names (``spec.named``) of the options a run is judged at
    (:data:`conformance.options.JUDGED_OPTIONS`). A run certified at 512 new tokens a rollout
    certifies no launch of 4,096, nor one judged by a looser profile. The profile compares by
    its bounds (a file or a name that loads to the certificate's thresholds is the profile it
    was judged by); the run shape by the limits the run drew up to (``run_shape``; ``spec`` is
    preflighted, so its limits are this host's, as the certified ones were that host's); the
    rest by their values in the certificate's ``spec``. A certificate that records no value of
    a named option certifies none."""
    named = [o for o in JUDGED_OPTIONS if o.name in spec.named]
    current = spec.option_values()
    recorded, shape, judged_by = (
        value if isinstance(value, dict) else {}
        for value in (certificate.get(k) for k in ("spec", "run_shape", "profile"))
    )
    # the engine's options, given or not, that the fingerprint does not hold (an engine on the
    # protocol's own info reports none); a server's address says where it runs, not what it
    # computes
    info = started.get("engine_info") or {}
    held = {"url", *info, *(info.get("knobs") or {})}
    asked, certified_options = (
        sorted(o for o in values if o.partition("=")[0] not in held)
        for values in (current["engine-option"] or [], recorded.get("engine-option") or [])
    )
    differences: list[tuple[str, object, object]] = []
    if asked != certified_options:
        differences.append(("spec.engine-option", certified_options, asked))
    for option in (o for o in named if o is not PROFILE):
        if option in RUN_SHAPE_OPTIONS:
            limit = option.name.replace("-", "_")
            key, certified = f"run_shape.{limit}", shape.get(limit, _UNRECORDED)
            now: object = getattr(spec.depth, limit)
        else:
            key, certified = f"spec.{option.name}", recorded.get(option.name, _UNRECORDED)
            now = current[option.name]
        if certified != now:
            differences.append((key, certified, now))
    if PROFILE in named:
        profile = load_profile(spec.profile)
        bounds = {"thresholds": profile.thresholds, "suites": profile.suites}
        certified_bounds = {
            "thresholds": judged_by.get("thresholds"),
            "suites": judged_by.get("suites") or {},
        }
        if json.dumps(bounds, sort_keys=True) != json.dumps(certified_bounds, sort_keys=True):
            name = judged_by.get("name")
            shown = f"{spec.profile} (other bounds)" if spec.profile == name else spec.profile
            differences.append(("profile", name, shown))
    return CertificateCheck(matches=not differences, differences=differences)


def _flatten(node: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts as ``{"a.b.c": leaf}``; lists and scalars are leaves."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, object] = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat
