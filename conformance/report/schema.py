"""report.json as typed records: the one definition of its layout, validated on load.

A report is a :class:`Report` holding :class:`Check` records (each with its :class:`Violation`
and :class:`Shrink` records), a :class:`ProfileInfo`, a :class:`Timing` and the stack
fingerprint, a :class:`Stack` mapping: engines and backends add their own info fields to it,
so only the fields every reader relies on are checked.

The layout is schema 1's, unchanged. Early schema-1 files lack ``depth``, ``timing`` and a
check's ``shrink``, ``seconds`` and ``worst_case_metrics``: those read as their defaults.

Adding a field is one line in its record, with a default, so files written before it still
load. Fields a file has that this version does not know are kept in ``unknown`` and written
back out, so a newer file read by an older harness loses nothing. Renaming, moving or removing
one changes the layout: bump ``SCHEMA`` and convert the older layout in ``parse_report``.
"""

from __future__ import annotations

import contextlib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, Union

from conformance.errors import UsageError
from conformance.metric_table import BY_NAME, Bound, Breach

if TYPE_CHECKING:
    from conformance.profiles import Profile

SCHEMA = 1

Status = Literal["pass", "fail", "error", "skip", "interrupted"]
Verdict = Literal["pass", "fail", "incomplete"]
#: what a check came to, as a reader is told it (:attr:`Check.judgement`): ``pass`` only for a
#: check held to some bound, ``reported`` for one that measured without being held to any,
#: ``not reached`` for one that passed measuring nothing
Judgement = Literal["pass", "fail", "reported", "skipped", "not reached"]
#: check statuses that stop a stack from being certified
FAILED: tuple[Status, ...] = ("fail", "error", "interrupted")
#: the suffix of the note a property records its own bound in (``sampler_p_value_bound``): a
#: property's metric is bounded by its suite, not by the profile (``Metric.family``)
BOUND_NOTE = "_bound"


class FieldError(ValueError):
    """One field of a report is missing or has the wrong type; ``field`` is its path."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"field {field or '(top level)'} {problem}")


@dataclass(kw_only=True)
class Record:
    """A JSON object with typed fields: ``from_json`` validates, ``to_json`` writes back."""

    #: fields of the file this version does not know, kept as they were
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: object, where: str = "") -> Self:
        """The record of the JSON object ``data``; ``where`` is its path, for errors."""
        if not isinstance(data, dict):
            raise FieldError(where, f"is {_kind(data)}, not an object")
        values: dict[str, Any] = {}
        for f in _fields(cls):
            path = f"{where}.{f.name}" if where else f.name
            if f.name in data:
                values[f.name] = _parse(data[f.name], _hints(cls)[f.name], path)
            elif f.default is MISSING and f.default_factory is MISSING:
                raise FieldError(path, "is missing")
        names = {f.name for f in _fields(cls)}
        return cls(**values, unknown={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> dict[str, Any]:
        """The JSON object: known fields in order, then the unknown ones. It shares the
        record's mappings and lists (copy it before changing it)."""
        out = {f.name: _dump(getattr(self, f.name)) for f in _fields(type(self))}
        return out | {k: v for k, v in self.unknown.items() if k not in out}


class Stack(dict[str, Any]):
    """The stack fingerprint (``conformance.fingerprint.fingerprint``): a mapping, since engines
    and backends add their own info fields; the fields below are checked, the rest kept."""

    #: the fields the gate, certificate, summary and page rely on, with their JSON types
    REQUIRED: typing.ClassVar[dict[str, type]] = {
        "fingerprint": str,
        "engine": str,
        "backend": str,
        "engine_dtype": str,
        "backend_dtype": str,
        "model": dict,
    }

    @classmethod
    def from_json(cls, data: object, where: str = "stack") -> Stack:
        if not isinstance(data, dict):
            raise FieldError(where, f"is {_kind(data)}, not an object")
        for key, kind in cls.REQUIRED.items():
            _expect(data, key, kind, where)
        _expect(data["model"], "sha256", str, f"{where}.model")
        return cls(data)

    @property
    def model_sha256(self) -> str:
        return self["model"]["sha256"]


@dataclass(kw_only=True)
class FeatureCoverage(Record):
    """One of the model's distinguishing features (:mod:`conformance.models.features`) and the
    checks that reached it: whose longest drawn sequence held more than ``from_position``
    tokens, among the checks held to a bound."""

    name: str
    what: str
    from_position: int = 0
    reached_by: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Violation(Record):
    """One metric on the wrong side of its threshold."""

    metric: str
    value: float
    threshold: float
    #: which side of the threshold is a violation (the metric table's, kept so the file
    #: reads on its own)
    bound: Bound

    def __str__(self) -> str:
        return str(Breach(self.metric, self.value, self.threshold, self.bound))

    @classmethod
    def of(cls, breach: Any) -> Violation:
        """The record of a ``conformance.metric_table.Breach`` (or anything with its four
        fields)."""
        return cls(
            metric=breach.metric, value=breach.value, threshold=breach.threshold, bound=breach.bound
        )


@dataclass(kw_only=True)
class Shrink(Record):
    """How long Hypothesis shrank a failure, and whether its time budget cut it short."""

    seconds: float
    examples: int
    cut_short: bool


@dataclass(kw_only=True)
class Check(Record):
    """One conformance test: its status, pooled metrics, violations and reproducer."""

    suite: str
    name: str
    nodeid: str
    status: Status
    message: str = ""
    #: mismatch metrics over every token measured, plus the suite's notes
    metrics: dict[str, float] = field(default_factory=dict)
    #: how many distinct tokens ``metrics`` pool (a token measured again in the same context
    #: counts once; files from before it lack it: pools of unknown size)
    tokens: int | None = None
    #: the bounds the measured metrics were held to (``Profile.bounds`` of this pool)
    thresholds: dict[str, float] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    #: metric → why the profile did not hold it to its threshold (the pooled metrics of a pool
    #: smaller than the profile's ``min_pooled_tokens``): its threshold is shown, not applied;
    #: empty when every bounded metric was judged, and in files from before the field
    not_judged: dict[str, str] = field(default_factory=dict)
    #: the case of the failure the check names (else its worst example), with ``replay``
    worst_case: dict[str, Any] | None = None
    #: what ``worst_case`` measured alone (``metrics`` pool every example the check ran)
    worst_case_metrics: dict[str, float] | None = None
    #: which of the check's ``examples_run`` measured examples ``worst_case`` is (1 for the
    #: first); None where it measured nothing, and in files from before the field
    worst_case_example: int | None = None
    shrink: Shrink | None = None
    #: down-sampled token points for the plots: ``lp_train``, ``lp_infer``, ``position``
    samples: dict[str, list[float]] | None = None
    examples_run: int = 0
    seconds: float | None = None
    #: what sets the check apart from the stack's own run (``knobs``: a variant engine's options)
    context: dict[str, Any] = field(default_factory=dict)
    #: the largest sizes its examples drew: ``prompt_len``, ``batch``, ``group_size`` (grouped
    #: batches), ``new_tokens`` (rollout length asked for); empty in files from before the field
    reached: dict[str, int] = field(default_factory=dict)

    def held(self) -> dict[str, tuple[float, float]]:
        """metric → (value, bound) for every bound the check was held to and that the file
        records: the profile's it judged (``thresholds`` less ``not_judged``), a property's own
        noted as ``<metric>_bound``, and each violation's (a failing property's breach)."""
        held = {
            name: (self.metrics[name], bound)
            for name, bound in self.thresholds.items()
            if name in self.metrics and name not in self.not_judged
        }
        for name, value in self.metrics.items():
            bound = self.metrics.get(name + BOUND_NOTE)
            if bound is not None and is_property(name):
                held[name] = (value, bound)
        for violation in self.violations:
            held[violation.metric] = (violation.value, violation.threshold)
        return held

    @property
    def judgement(self) -> Judgement:
        """What the check came to: ``fail`` (failed, errored or interrupted), ``skipped``, or
        for a pass, ``pass`` if it was held to a bound (the profile's, or a property's own:
        a property metric's presence says its suite held it, even where the file does not
        record the bound), ``reported`` if it measured without being held to any (a
        retokenization drift), ``not reached`` if it measured nothing."""
        if self.status in FAILED:
            return "fail"
        if self.status == "skip":
            return "skipped"
        if self.held() or any(is_property(name) for name in self.metrics):
            return "pass"
        return "reported" if self.metrics else "not reached"


@dataclass(kw_only=True)
class ProfileInfo(Record):
    """The tolerance profile the run was judged by."""

    name: str
    source: str | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    #: suite → the bounds that replaced the base ones for that suite's checks (``[suites.NAME]``
    #: of the profile); empty when none did, and in files from before the field
    suites: dict[str, dict[str, float]] = field(default_factory=dict)
    #: pools of fewer tokens were not held to the pooled bounds
    min_pooled_tokens: int = 1
    #: past this pool the pool-scaled bounds grew as √(n / it) (``Metric.pool_scaled``); None
    #: when the profile sets none, and in files from before the field
    max_pooled_tokens: int | None = None
    #: what the profile was calibrated on (its ``[provenance]``: models, device, versions,
    #: sizes, seeds); absent for a hand-written profile and in files from before the field
    provenance: dict[str, Any] | None = None
    #: the one line saying the stack's model or device is not the one the profile was
    #: calibrated on; None when it is, or when the profile records no provenance
    foreign: str | None = None

    @classmethod
    def of(cls, profile: Profile, foreign: str | None = None) -> Self:
        """The record of a loaded profile; ``foreign`` is its ``foreign_to`` line for the
        run's model and device."""
        return cls(
            name=profile.name,
            source=str(profile.source),
            thresholds=profile.thresholds,
            suites=profile.suites,
            min_pooled_tokens=profile.min_pooled_tokens,
            max_pooled_tokens=profile.max_pooled_tokens,
            provenance=profile.provenance or None,
            foreign=foreign,
        )


@dataclass(kw_only=True)
class Timing(Record):
    """Wall time, the engines' and backends' own seconds, and the harness's overhead per
    second of theirs."""

    wall_s: float
    engine_start_s: float = 0.0
    engine_s: float = 0.0
    backend_start_s: float = 0.0
    backend_s: float = 0.0
    harness_overhead: float = 0.0


@dataclass(kw_only=True)
class Report(Record):
    """One run: the verdict, the stack, the profile and every check."""

    schema: int = SCHEMA
    verdict: Verdict
    reason: str | None = None
    #: what to do about an ``incomplete`` run: the fix the failing component named, or where
    #: the traceback of a harness/adapter fault is logged
    fix: str | None = None
    created: str
    command: str
    seed: int
    examples: int
    #: the depth setting (schema-1 files from before it lack it)
    depth: str | None = None
    #: the limits the run drew up to: the depth's, or the run shape given in their place
    #: (``max_prompt_len``, ``max_new_tokens``, ``max_batch``, ``max_batch_tokens``,
    #: ``group_size``); files from before the field lack it
    run_shape: dict[str, int | None] | None = None
    #: what the run covered: ``stack`` (every suite of the folders it ran, nothing deselected:
    #: a pass certifies the stack) or ``suites`` (some of them: a pass certifies those only);
    #: files from before the field lack it
    scope: Literal["stack", "suites"] | None = None
    #: the stack options the run resolved, as the command line spells them
    #: (``StackSpec.option_values``), from which ``tim-conformance check`` rebuilds the stack; files
    #: from before the field lack it
    spec: dict[str, str | list[str] | None] | None = None
    stack: Stack
    profile: ProfileInfo
    checks: list[Check]
    timing: Timing | None = None
    #: the RL smoke run's summary (free-form: the RL loop's own fields), if one ran
    rl: dict[str, Any] | None = None
    #: the model's features and the checks that reached each; files from before it lack it
    coverage: list[FeatureCoverage] = field(default_factory=list)

    def unreached(self) -> list[FeatureCoverage]:
        """The model's features no check reached: the run did not exercise them."""
        return [feature for feature in self.coverage if not feature.reached_by]

    def suites(self) -> dict[str, list[Check]]:
        """Checks grouped by suite, in first-seen order."""
        grouped: dict[str, list[Check]] = {}
        for check in self.checks:
            grouped.setdefault(check.suite, []).append(check)
        return grouped


def is_property(name: str) -> bool:
    """Whether ``name`` is a property's own finding, bounded by the suite that measures it."""
    fact = BY_NAME.get(name)
    return fact is not None and fact.family == "property"


def parse_report(data: object, where: str = "report") -> Report:
    """The :class:`Report` of a decoded report.json; a bad one is a one-line UsageError naming
    ``where`` and the field."""
    version = data.get("schema") if isinstance(data, dict) else None
    if type(version) is not int or version != SCHEMA:  # true == 1 in Python, not in JSON
        found = f"schema {version!r}" if isinstance(data, dict) else _kind(data)
        raise UsageError(
            f"{where} is not a report.json this version reads ({found}; reads schema {SCHEMA})",
            "pass the report.json that certify or --tim-report wrote",
        )
    try:
        return Report.from_json(data)
    except FieldError as exc:
        raise UsageError(
            f"{where}: {exc}", "regenerate it with tim-conformance certify, or fix that field"
        ) from None


def load_report(path: Path) -> Report:
    """Read and validate a report.json; any problem is a one-line UsageError naming the file
    (and the field, for a malformed one)."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"no report at {path}", "pass the report.json that certify or --tim-report wrote"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", "pass a readable report.json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path} is not JSON ({exc.msg} at line {exc.lineno})",
            "pass the report.json itself, not results.jsonl or an HTML file",
        ) from None
    return parse_report(data, str(path))


def as_report(report: Report | Mapping[str, Any], where: str = "report") -> Report:
    """``report`` itself, or the validated record of a decoded report.json."""
    return report if isinstance(report, Report) else parse_report(report, where)


# -- the type-directed parser --------------------------------------------------------------


@cache
def _fields(cls: type[Record]) -> tuple[Any, ...]:
    return tuple(f for f in fields(cls) if f.name != "unknown")


@cache
def _hints(cls: type[Record]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse(value: object, hint: Any, where: str) -> Any:
    """``value`` checked against the type ``hint`` (records parsed into their class)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        *others, last = (a for a in args if a is not type(None))
        # the first alternative the value is; failing all, the last one's complaint
        for kind in others:
            with contextlib.suppress(FieldError):
                return _parse(value, kind, where)
        return _parse(value, last, where)
    if origin is Literal:
        if value not in args:
            raise FieldError(where, f"is {value!r}, not one of {', '.join(map(str, args))}")
        return value
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return hint.from_json(value, where)
    if origin is dict:
        _check_type(value, dict, where)
        items = value.items()  # type: ignore[union-attr]
        if _all_plain(args[1], (v for _, v in items)):
            return value
        return {k: _parse(v, args[1], f"{where}.{k}") for k, v in items}
    if origin is list:
        _check_type(value, list, where)
        if _all_plain(args[0], value):  # type: ignore[arg-type]
            return value
        return [_parse(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]  # type: ignore[arg-type]
    _check_type(value, hint, where)
    return value


def _all_plain(hint: Any, values: Iterable[object]) -> bool:
    """Whether ``hint`` is a JSON scalar type and every value is one: the fast path for the
    thousands of token samples a check holds (the slow path names the first bad one)."""
    exact = _EXACT_TYPES.get(hint)
    return hint is Any or (exact is not None and all(type(v) in exact for v in values))


def _expect(data: dict[str, Any], key: str, kind: type, where: str) -> None:
    """Raise FieldError unless ``data[key]`` is there and a JSON ``kind``."""
    if key not in data:
        raise FieldError(f"{where}.{key}", "is missing")
    _check_type(data[key], kind, f"{where}.{key}")


def _check_type(value: object, kind: type, where: str) -> None:
    """Raise FieldError unless ``value`` is a JSON ``kind``; an int is a float, a bool is
    neither (JSON has one number type, and ``true`` is not 1)."""
    ok = (
        isinstance(value, int | float) and not isinstance(value, bool)
        if kind is float
        else isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    )
    if not ok:
        raise FieldError(where, f"is {_kind(value)}, not {_JSON_NAMES[kind]}")


#: the Python types json.loads gives for each JSON scalar type (no bool among the numbers)
_EXACT_TYPES: dict[Any, tuple[type, ...]] = {
    float: (float, int),
    int: (int,),
    str: (str,),
    bool: (bool,),
}
_JSON_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
}


def _kind(value: object) -> str:
    """How a JSON value reads in an error: ``"the string 'x'"``, ``"a list"``, ``"null"``."""
    if value is None:
        return "null"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, bool | int | float):
        return f"the value {json.dumps(value)}"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _dump(value: object) -> object:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list) and value and isinstance(value[0], Record):
        return [item.to_json() for item in value]
    return value


__all__ = [
    "BOUND_NOTE",
    "FAILED",
    "SCHEMA",
    "Check",
    "FeatureCoverage",
    "FieldError",
    "Judgement",
    "ProfileInfo",
    "Record",
    "Report",
    "Shrink",
    "Stack",
    "Status",
    "Timing",
    "Verdict",
    "Violation",
    "as_report",
    "is_property",
    "load_report",
    "parse_report",
]
