"""What suites call to measure: announce an example's case, measure its log-probabilities,
hold them to the profile; and what one check kept of its examples.

Every example announces its case (``Recorder.case``) before it runs the stack, so however the
example fails — a profile violation, a NaN, an engine error — the case on record is the one
that failed. Hypothesis runs its final, shrunk falsifying example last, so the case kept per
failure origin is the minimal one. After its drawn examples pass, a property runs one more,
at the top sizes (:func:`run_at_top`), so every run reaches its depth's largest case.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, Protocol, TypeVar

import torch
from hypothesis import Phase, settings

from conformance.errors import NonFiniteLogprobs, UsageError
from conformance.metric_table import EXAMPLE_METRICS, Breach
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.outcome import ProfileViolation, PropertyFailure, first_line, origin
from conformance.routing import routing_metrics
from conformance.strategies import (
    BatchShape,
    at_batch_size,
    at_top_sizes,
    drawing_at_top,
    drawing_batch_size,
)

if TYPE_CHECKING:
    from conformance.engines.base import SamplingSpec
    from conformance.profiles import Profile

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: token-level points kept per check for the report's plots; the rest stay in results.jsonl
MAX_SAMPLES = 2000
#: how a failure message names the two sides ``measure`` compares, by default the backend's
#: recompute and the engine's report; a check comparing an engine with itself names its own
SIDES = ("the backend's (lp_train)", "the engine's (lp_infer)")


class _HypothesisHandle(Protocol):
    #: the property's body, which each example runs
    inner_test: Callable[..., object]


class _GivenTest(Protocol):
    """A ``@given`` property as Hypothesis leaves it: called with no arguments, with its
    handle (``.hypothesis``) and the settings it was decorated under set on it."""

    hypothesis: _HypothesisHandle
    _hypothesis_internal_use_settings: settings

    def __call__(self) -> object: ...


class RepeatedCase(Exception):
    """Raised by ``Recorder.case`` for a case the check has already run and passed: the
    example ends there, passing (``Recorder.watched``)."""


@dataclass
class Example:
    """One example of a check (a failing one, or the worst): its case, what it measured and
    which of the check's measured examples it was (1 for the first), if it got that far."""

    case: dict[str, Any] | None
    metrics: dict[str, float] | None
    number: int | None = None


@dataclass
class CheckRecord:
    """What one conformance test measured, pooled over its Hypothesis examples."""

    suite: str
    name: str
    nodeid: str
    #: ``time.perf_counter()`` when the check began
    started: float = 0.0
    #: per measured sequence: (lp_train, lp_infer, positions) as 1-D tensors, of the tokens
    #: not pooled before (see ``Recorder.measure``'s ``contexts``)
    rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    #: the contexts (``context_keys``) of every token pooled so far
    pooled_contexts: set[int] = field(default_factory=set)
    #: per measured sequence of an MoE stack: the engine's and the backend's experts ``[tokens,
    #: layers, k]`` and |log ρ| at those tokens; empty where routes were not measured
    routes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    #: the cases of the examples that passed having announced one case: Hypothesis draws some
    #: cases twice from different choices, and on a deterministic stack a repeat measures
    #: nothing new (the pool holds each token's context once)
    passed_cases: set[str] = field(default_factory=set)
    #: the cases the running example announced so far
    example_cases: list[str] = field(default_factory=list)
    #: the sampled batches the support property already held (``support_audit.audit_key``): the
    #: same batch again, a seeded rerun or a case Hypothesis drew twice, would repeat the
    #: backend's whole forward for the same finding
    audited: set[str] = field(default_factory=set)
    #: what sets the check apart from the stack's own run (e.g. a variant engine's options)
    context: dict[str, Any] = field(default_factory=dict)
    #: the example with the largest max |log ρ| (NaN/inf tokens first), with that severity
    worst: tuple[float, Example] | None = None
    examples_run: int = 0
    #: the running example's number among the measured ones (``examples_run`` once it
    #: measured; 0 until then)
    example: int = 0
    #: the running example's announced case and last measurement
    case: dict[str, Any] | None = None
    metrics: dict[str, float] | None = None
    #: the last failing example per failure origin (the shrunk one once Hypothesis is done)
    failures: dict[tuple[str, str, int], Example] = field(default_factory=dict)
    #: the last failing example's failure, in one line, and the bound it names where it names
    #: one: what a report written while the check still runs says of it (the exception itself
    #: would hold its frames' tensors)
    failed_with: str = ""
    breach: Breach | None = None
    #: wall-clock marks for shrinking: the first failure, and the last example
    first_failure_at: float | None = None
    last_example_at: float = 0.0
    examples_after_failure: int = 0
    #: where the running example's first NaN/inf log-prob is, for its failure message
    nonfinite_at: str = ""
    #: what a passing check says it did not cover (see ``Recorder.remark``)
    remarks: list[str] = field(default_factory=list)
    #: the largest sizes its examples drew (``reached_sizes``), to show a run's shape was reached
    reached: dict[str, int] = field(default_factory=dict)

    def count(self, **counts: float) -> None:
        """Add ``counts`` to the check's extra numbers (e.g. tokens audited so far)."""
        for key, value in counts.items():
            self.extra[key] = self.extra.get(key, 0.0) + value

    def tokens(self) -> int:
        """How many tokens the pooled metrics pool."""
        return sum(row[0].numel() for row in self.rows)

    def pooled(self) -> dict[str, float]:
        """Mismatch metrics over every token measured so far, plus notes."""
        metrics: dict[str, float] = {}
        if self.rows:
            train, mask = stack_ragged([r[0] for r in self.rows])
            infer, _ = stack_ragged([r[1] for r in self.rows])
            metrics = _safe_metrics(mismatch_metrics, train, infer, mask)
        if self.routes:
            metrics |= routing_metrics(*zip(*self.routes, strict=True))
        return {**metrics, **self.extra}

    def samples(self) -> dict[str, list[float]] | None:
        """Evenly down-sampled finite token points (at most ``MAX_SAMPLES``), for the plots."""
        if not self.rows:
            return None
        train = torch.cat([r[0] for r in self.rows])
        infer = torch.cat([r[1] for r in self.rows])
        position = torch.cat([r[2] for r in self.rows])
        finite = torch.isfinite(train) & torch.isfinite(infer)
        train, infer, position = train[finite], infer[finite], position[finite]
        stride = max(1, -(-train.numel() // MAX_SAMPLES))
        return {
            "lp_train": train[::stride].tolist(),
            "lp_infer": infer[::stride].tolist(),
            "position": position[::stride].tolist(),
        }

    def failure_for(self, exc: BaseException | None) -> Example | None:
        """The recorded failing example behind ``exc`` (by origin), else the last failure."""
        if exc is not None and origin(exc) in self.failures:
            return self.failures[origin(exc)]
        return next(reversed(self.failures.values()), None)

    def shrink(self, budget_s: float) -> dict[str, Any] | None:
        """How long shrinking took, and whether Hypothesis's time budget cut it short."""
        if self.first_failure_at is None:
            return None
        seconds = self.last_example_at - self.first_failure_at
        return {
            "seconds": round(seconds, 3),
            "examples": self.examples_after_failure,
            "cut_short": seconds >= budget_s,
        }


class Recorder:
    """The suites' handle on the running check (session-scoped: Hypothesis examples share it).
    ``log`` hears of each measurement, ``replay`` gives a check's replay command, and
    ``example_ended`` is told of each example's end (the report written as the run stands)."""

    def __init__(
        self,
        profile: Profile,
        *,
        log: Callable[..., None],
        replay: Callable[[str], str],
        example_ended: Callable[[CheckRecord], None] = lambda record: None,
    ) -> None:
        self._profile = profile
        self._log = log
        self._replay = replay
        self._example_ended = example_ended
        self.current: CheckRecord | None = None

    @contextmanager
    def checking(self, record: CheckRecord) -> Iterator[CheckRecord]:
        """Point the recorder at ``record`` while the check it records runs."""
        self.current = record
        try:
            yield record
        finally:
            self.current = None

    # -- the suites' API -------------------------------------------------------------------
    def case(
        self,
        prompts: Sequence[Sequence[int]],
        shape: BatchShape | None = None,
        sampling: SamplingSpec | None = None,
        **extra: object,
    ) -> dict[str, Any]:
        """Announce the running example's reproducer — prompt ids, batch shape, sampling spec
        and anything else it drew — before it runs the stack; returns it. An example whose one
        case the check has already run and passed ends here, passing (:class:`RepeatedCase`),
        until the check first fails."""
        record = self._require_check()
        record.case = {
            "prompt_ids": [list(p) for p in prompts],
            "batch_shape": shape.as_dict() if shape else {"batch_size": len(prompts)},
            "sampling": sampling.as_dict() if sampling else None,
            # a failure first found here is not shrunk: its sizes cannot leave the top
            **({"top_sizes": True} if drawing_at_top() else {}),
            # one of the examples run at each batch-size bucket (not shrunk either)
            **({"batch_bucket_size": size} if (size := drawing_batch_size()) else {}),
            **extra,
        }
        for key, size in reached_sizes(prompts, shape, sampling).items():
            record.reached[key] = max(size, record.reached.get(key, 0))
        announced = json.dumps(record.case, sort_keys=True, default=str)
        record.example_cases.append(announced)
        # once a failure is found every example runs: shrinking and the final replay of a
        # stack that fails only sometimes must see it fail again
        if (
            record.first_failure_at is None
            and len(record.example_cases) == 1
            and announced in record.passed_cases
        ):
            self._log(event="repeated_case", suite=record.suite, nodeid=record.nodeid)
            raise RepeatedCase(announced)
        return record.case

    def measure(
        self,
        lp_train: Sequence[Any],
        lp_infer: Sequence[Any],
        *,
        positions: Sequence[Sequence[int]] | None = None,
        sides: tuple[str, str] = SIDES,
        routes: tuple[Sequence[Any], Sequence[Any]] | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
        scored_at: Sequence[Sequence[int]] | None = None,
    ) -> dict[str, float]:
        """Record token-aligned log-prob rows of the running example; return its metrics.

        ``contexts`` holds, per row, the token sequence whose last tokens the row's values are
        the log-probabilities of (a scored sequence; a prompt and its rollout), or the tokens
        at ``scored_at``'s indices where given (a conversation's turns). A token in a
        context the check has already pooled is a second measurement of the same quantity, so
        the pool keeps its first: Hypothesis replays examples with small changes and RL batches
        repeat prompts, and counting every copy would make the pool's |Σ log ρ|/√n grow as
        √copies with no bias at all. The example's own metrics count every row.

        ``routes`` holds, for an MoE stack, the engine's and the backend's experts per row at
        the same tokens (``[tokens, layers, k]`` each): the routing metrics join the others.

        Rows may be lists or 1-D tensors. NaN/inf values are measured, not raised: they count
        as ``nonfinite_tokens``, which every profile bounds at 0, and the failure says on which
        of the ``sides`` (what ``lp_train`` and ``lp_infer`` hold, as a message names them) the
        first one is.
        """
        record = self._require_check()
        train_rows = [torch.as_tensor(r, dtype=torch.float64).reshape(-1) for r in lp_train]
        infer_rows = [torch.as_tensor(r, dtype=torch.float64).reshape(-1) for r in lp_infer]
        train, mask = stack_ragged(train_rows)
        infer, _ = stack_ragged(infer_rows)
        metrics = _safe_metrics(mismatch_metrics, train, infer, mask)
        record.examples_run += 1
        record.example = record.examples_run
        for i, (t, n) in enumerate(zip(train_rows, infer_rows, strict=True)):
            where = torch.as_tensor(positions[i]) if positions else torch.arange(t.numel())
            if contexts is not None:
                context = contexts[i]
                at = scored_at[i] if scored_at else range(len(context) - t.numel(), len(context))
                if len(at) != t.numel() or not all(0 <= j < len(context) for j in at):
                    raise UsageError(
                        f"row {i} holds {t.numel()} log-probs but its context of "
                        f"{len(context)} tokens does not hold them",
                        "pass as each row's context the whole sequence it scores",
                    )
                every = context_keys(context)
                keys = [every[j] for j in at]
                new = torch.tensor([k not in record.pooled_contexts for k in keys], dtype=bool)
                record.pooled_contexts.update(keys)
                t, n, where = t[new], n[new], where[new]
            if t.numel():
                record.rows.append((t, n, where))
        if routes is not None:
            diffs = [(t - n).abs() for t, n in zip(train_rows, infer_rows, strict=True)]
            measured = list(zip(*routes, diffs, strict=True))
            metrics |= routing_metrics(*zip(*measured, strict=True))
            record.routes.extend(measured)
        record.metrics = metrics
        severity = metrics.get("abs_diff_max", 0.0) + metrics["nonfinite_tokens"]
        if record.worst is None or severity > record.worst[0]:
            record.worst = (severity, Example(record.case, metrics, record.example or None))
        self._log(
            event="measurement",
            suite=record.suite,
            nodeid=record.nodeid,
            case=record.case,
            metrics=metrics,
        )
        if metrics["nonfinite_tokens"]:
            record.nonfinite_at = _first_nonfinite(train_rows, infer_rows, sides)
        return metrics

    def violations(
        self, lp_train: Sequence[Any], lp_infer: Sequence[Any], *, per_example: bool = False
    ) -> list[Any]:
        """The profile's violations — by every bound, per-example and pooled alike — of these
        rows alone, without recording them: for testing a hypothesis about what an engine
        reports. ``per_example`` keeps to the bounds ``check_profile`` holds an example to (to
        replay a failing example on other engines)."""
        train, mask = stack_ragged([torch.as_tensor(r, dtype=torch.float64) for r in lp_train])
        infer, _ = stack_ragged([torch.as_tensor(r, dtype=torch.float64) for r in lp_infer])
        metrics = _safe_metrics(mismatch_metrics, train, infer, mask)
        if per_example:
            metrics = {k: v for k, v in metrics.items() if k in EXAMPLE_METRICS}
        return self._profile.check(
            metrics, tokens=int(mask.sum()), suite=self._require_check().suite
        )

    def note(self, **values: float) -> None:
        """Record extra per-check numbers (e.g. a simulated floor) next to the metrics."""
        record = self._require_check()
        record.extra.update(values)
        self._log(event="note", nodeid=record.nodeid, values=values)

    def remark(self, text: str) -> None:
        """Say what the running check could not cover (its report message when it passes)."""
        remarks = self._require_check().remarks
        if text not in remarks:
            remarks.append(text)

    def describe(self, **context: object) -> None:
        """Record what sets the running check apart (its report entry's ``context``)."""
        self._require_check().context.update(context)

    def check_profile(self, metrics: dict[str, float], *, where: str = "") -> None:
        """Hold one example to the profile's per-token and per-sequence bounds; the failure
        names metric, value, threshold, ``where`` (what the property found of the difference:
        the position it starts at), the case and the replay command."""
        record = self._require_check()
        violations = self._profile.check(
            {k: v for k, v in metrics.items() if k in EXAMPLE_METRICS}, suite=record.suite
        )
        if violations:
            detail = f" — {record.nonfinite_at}" if metrics["nonfinite_tokens"] else ""
            detail += f" — {where}" if where else ""
            self._raise_violation(
                violations,
                f"{_describe(violations)} (profile {self._profile.name}){detail}",
                metrics,
            )

    def check_pooled(self) -> None:
        """Hold the profile's population metrics over every token the test measured."""
        record = self._require_check()
        pooled = record.pooled()
        violations = self._profile.check(
            {k: v for k, v in pooled.items() if k not in EXAMPLE_METRICS},
            tokens=record.tokens(),
            suite=record.suite,
        )
        if violations and record.worst is not None:
            worst = record.worst[1]
            # the failure is kept as the worst example's (``example_failed``)
            record.case, record.example = worst.case, worst.number or 0
            self._raise_violation(
                violations,
                f"{_describe(violations)} over all {record.examples_run} examples pooled "
                f"(profile {self._profile.name}); the worst example below",
                worst.metrics,
            )

    def fail(
        self,
        headline: str,
        metrics: dict[str, float] | None = None,
        *,
        breach: Breach | None = None,
    ) -> NoReturn:
        """Fail the running example with the property's own finding, named by ``breach`` (its
        metric, value and bound: the check's violation) where it has one; the message carries
        them, the case and the replay command."""
        if breach is not None:
            headline = f"{headline} [{breach}]"
        record = self._require_check()
        if metrics is not None:
            record.metrics = metrics
        raise PropertyFailure(self._located(record, headline), breach)

    def _raise_violation(
        self, violations: Sequence[Breach], headline: str, metrics: dict[str, float] | None
    ) -> NoReturn:
        record = self._require_check()
        if metrics is not None:
            record.metrics = metrics
        raise ProfileViolation(self._located(record, headline), violations[0])

    def _located(self, record: CheckRecord, headline: str) -> str:
        return (
            f"{record.suite}: {headline}\n  case: {json.dumps(record.case)}\n"
            f"  replay: {self._replay(record.nodeid)}"
        )

    # -- the plugin's side -----------------------------------------------------------------
    def watched(self, run: Callable[_P, _R]) -> Callable[_P, _R | None]:
        """``run`` as one example: its failure kept under its origin, its end marked (wraps
        each Hypothesis example a test runs)."""

        def example(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
            self.begin_example()
            try:
                result = run(*args, **kwargs)
            except RepeatedCase:
                return None
            except BaseException as exc:
                self.example_failed(exc)
                raise
            finally:
                self.example_ended()
            self.example_passed()
            return result

        return example

    def run(self, test: _GivenTest) -> None:
        """Run the ``@given`` property ``test`` inside the running check, each example watched
        as the plugin watches a test's own: for a test that acts on the shrunk failure."""
        handle = test.hypothesis
        inner = handle.inner_test
        handle.inner_test = self.watched(inner)
        try:
            test()
            run_at_top(test, test)
        finally:
            handle.inner_test = inner

    def begin_example(self) -> None:
        record = self._require_check()
        record.case = record.metrics = None
        record.example = 0
        record.example_cases = []
        record.nonfinite_at = ""
        if record.first_failure_at is not None:
            record.examples_after_failure += 1

    def example_failed(self, exc: BaseException) -> None:
        """Keep the failing example's case under its origin (a later, smaller one replaces it)."""
        record = self._require_check()
        now = time.perf_counter()
        record.failures[origin(exc)] = Example(record.case, record.metrics, record.example or None)
        record.failed_with = f"{type(exc).__name__}: {first_line(exc)}"
        record.breach = getattr(exc, "breach", None)
        if record.first_failure_at is None:
            record.first_failure_at = now

    def example_passed(self) -> None:
        """Keep the passing example's case, where it announced one, to skip its repeats."""
        record = self._require_check()
        if len(record.example_cases) == 1:
            record.passed_cases.add(record.example_cases[0])

    def example_ended(self) -> None:
        record = self._require_check()
        record.last_example_at = time.perf_counter()
        self._example_ended(record)

    def _require_check(self) -> CheckRecord:
        if self.current is None:
            raise RuntimeError("the recorder is only usable inside a conformance test")
        return self.current


def run_at_top(test: _GivenTest, run: Callable[[], object]) -> None:
    """Run the ``@given`` property ``test`` (through ``run``) on its largest case: one example
    at the top sizes, and where the token budget held that batch's prompts short, one more at
    the longest prompts (:func:`conformance.strategies.at_top_sizes`).

    Hypothesis's first example makes every choice the simplest, which ``at_top_sizes`` draws
    at the top sizes; one example stops it there. Log-uniform draws reach a size's top in one
    example of eight, so 20 examples miss it about one run in fifteen, and every check sharing
    a seed misses it together; this never does. Neither example is shrunk (its sizes stay at
    the top whatever else changes, and each try costs the largest engine call), and their
    choices give the smallest case outside, so none go to the example database.
    """
    with _one_example(test), at_top_sizes() as top:
        run()
    if top.cut_short:
        with _one_example(test), at_top_sizes("length"):
            run()


@contextmanager
def one_example_at_batch_size(test: _GivenTest, size: int) -> Iterator[None]:
    """While inside, the ``@given`` property ``test`` runs one example, its batches ``size``
    sequences long (:func:`conformance.strategies.at_batch_size`): run once per
    ``batch_buckets`` size, every run reaches every batch-size bucket. Not shrunk nor stored,
    as :func:`run_at_top`'s."""
    with _one_example(test), at_batch_size(size):
        yield


@contextmanager
def _one_example(test: _GivenTest) -> Iterator[None]:
    """While inside, ``test`` runs Hypothesis's first (simplest-choice) example only, kept out
    of the example database."""
    # @given keeps the settings it was decorated under here, and Hypothesis has no public way
    # to change them for one call
    drawn = test._hypothesis_internal_use_settings
    test._hypothesis_internal_use_settings = settings(
        parent=drawn, max_examples=1, database=None, phases=(Phase.generate,)
    )
    try:
        yield
    finally:
        test._hypothesis_internal_use_settings = drawn


def reached_sizes(
    prompts: Sequence[Sequence[int]], shape: BatchShape | None, sampling: SamplingSpec | None
) -> dict[str, int]:
    """The sizes one example drew, by the run-shape limit each is held against: longest prompt,
    batch, GRPO group (grouped batches only) and rollout length asked for; and the longest
    sequence (prompt and rollout), which says which of the model's features it reached
    (:mod:`conformance.models.features`)."""
    sizes = {"prompt_len": max(map(len, prompts), default=0), "batch": len(prompts)}
    if getattr(shape, "kind", None) == "grouped":
        sizes["group_size"] = shape.group_size
    if sampling is not None:
        sizes["new_tokens"] = sampling.max_new_tokens
    sizes["sequence_len"] = sizes["prompt_len"] + sizes.get("new_tokens", 0)
    return sizes


def context_keys(sequence: Sequence[int]) -> list[int]:
    """One key per position of ``sequence``: the hash of the sequence up to and including it,
    so two positions share a key exactly when they hold the same token after the same prefix
    (up to 64-bit hash collisions)."""
    keys, key = [], 0
    for token in sequence:
        key = hash((key, int(token)))
        keys.append(key)
    return keys


def _safe_metrics(
    compute: Callable[..., dict[str, float]], *tensors: torch.Tensor
) -> dict[str, float]:
    """Metrics, or just the count when every token is NaN/inf (nothing else is defined)."""
    try:
        return compute(*tensors)
    except NonFiniteLogprobs as exc:
        if not exc.count:
            raise
        return {"nonfinite_tokens": float(exc.count)}


def _first_nonfinite(
    train_rows: list[torch.Tensor], infer_rows: list[torch.Tensor], sides: tuple[str, str]
) -> str:
    """Where the first NaN/inf is, and on which side, for the failure message."""
    for row, (train, infer) in enumerate(zip(train_rows, infer_rows, strict=True)):
        for side, values in zip(sides, (train, infer), strict=True):
            bad = (~torch.isfinite(values)).nonzero()
            if bad.numel():
                col = int(bad[0])
                return f"{side} log-prob is {float(values[col])} at sequence {row}, token {col}"
    return ""


def _describe(violations: Sequence[Breach]) -> str:
    return "; ".join(str(v) for v in violations)


__all__ = [
    "CheckRecord",
    "Recorder",
]
