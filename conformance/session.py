"""One conformance session: the engine and backend (started once), the recorder that streams
every measurement to ``results.jsonl``, and the summary written to ``report.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.backends import BACKENDS, Backend
from conformance.engines import ENGINES, Engine
from conformance.errors import ConformanceError, EngineCrashed, EngineUnavailable
from conformance.guard import CallTimedOut, Guarded, deadline
from conformance.stack import StackSpec, fingerprint

#: token-level points kept per check for the report's plots; the rest stay in results.jsonl
MAX_SAMPLES = 2000
#: bounds on single tokens and single sequences: checked on every example, so Hypothesis can
#: shrink a violation to a minimal reproducer. The other metrics are averages, spreads,
#: correlations and KLs of a token *population* — one token's ρ is not a mean ρ — so they are
#: checked on all of a test's tokens pooled, after its last example.
PER_EXAMPLE_METRICS = frozenset(
    {"abs_diff_max", "prob_diff_max", "rho_max", "rho_min", "seq_log_ratio_abs_max"}
)


@dataclass
class CheckRecord:
    """What one conformance test measured, pooled over its Hypothesis examples."""

    suite: str
    name: str
    nodeid: str
    lp_train: list[list[float]] = field(default_factory=list)
    lp_infer: list[list[float]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    worst: tuple[float, dict[str, Any], dict[str, float]] | None = None
    failing_case: dict[str, Any] | None = None
    failing_metrics: dict[str, float] | None = None
    examples_run: int = 0

    def pooled(self) -> dict[str, float]:
        """Mismatch metrics over every token measured so far, plus notes."""
        from conformance.metrics import mismatch_metrics, stack_ragged

        metrics: dict[str, float] = {}
        if self.lp_train:
            train, mask = stack_ragged(self.lp_train)
            infer, _ = stack_ragged(self.lp_infer)
            metrics = mismatch_metrics(train, infer, mask)
        return {**metrics, **self.extra}


class Recorder:
    """What suites call to measure; streams each measurement as it is taken."""

    def __init__(self, session: HarnessSession) -> None:
        self._session = session
        self.current: CheckRecord | None = None

    def measure(
        self,
        lp_train: Sequence[Sequence[float]],
        lp_infer: Sequence[Sequence[float]],
        *,
        case: dict[str, Any],
        positions: Sequence[Sequence[int]] | None = None,
    ) -> dict[str, float]:
        """Record token-aligned logprob rows of one example; return its mismatch metrics."""
        from conformance.metrics import mismatch_metrics, stack_ragged

        record = self._require_check()
        train_rows, infer_rows = _float_rows(lp_train), _float_rows(lp_infer)
        train, mask = stack_ragged(train_rows)
        infer, _ = stack_ragged(infer_rows)
        metrics = mismatch_metrics(train, infer, mask)
        record.examples_run += 1
        record.lp_train.extend(train_rows)
        record.lp_infer.extend(infer_rows)
        record.positions.extend(
            [list(p) for p in positions] if positions else [list(range(len(r))) for r in lp_train]
        )
        severity = metrics["abs_diff_max"]
        if record.worst is None or severity > record.worst[0]:
            record.worst = (severity, case, metrics)
        self._session.log(
            event="measurement",
            suite=record.suite,
            nodeid=record.nodeid,
            case=case,
            metrics=metrics,
        )
        return metrics

    def note(self, **values: float) -> None:
        """Record extra per-check numbers (e.g. a simulated floor) next to the metrics."""
        record = self._require_check()
        record.extra.update(values)
        self._session.log(event="note", nodeid=record.nodeid, values=values)

    def check_profile(self, metrics: dict[str, float], case: dict[str, Any]) -> None:
        """Assert the profile's per-token/per-sequence bounds on one example; the failure names
        metric, value, threshold, case and replay command."""
        per_example = {k: v for k, v in metrics.items() if k in PER_EXAMPLE_METRICS}
        violations = self._session.profile.check(per_example)
        if violations:
            self.fail(
                f"{_describe(violations)} (profile {self._session.profile.name})", case, metrics
            )

    def check_pooled(self) -> None:
        """Assert the profile's population metrics over every token the test measured."""
        record = self._require_check()
        pooled = record.pooled()
        violations = self._session.profile.check(
            {k: v for k, v in pooled.items() if k not in PER_EXAMPLE_METRICS}
        )
        if violations and record.worst is not None:
            self.fail(
                f"{_describe(violations)} over all {record.examples_run} examples pooled "
                f"(profile {self._session.profile.name}); worst example below",
                record.worst[1],
                record.worst[2],
            )

    def fail(self, headline: str, case: dict[str, Any], metrics: dict[str, float]) -> None:
        """Fail the current example with a message that carries its minimal reproducer."""
        record = self._require_check()
        record.failing_case, record.failing_metrics = case, metrics
        replay = self._session.replay_command(record.nodeid)
        raise AssertionError(
            f"{record.suite}: {headline}\n  case: {json.dumps(case)}\n  replay: {replay}"
        )

    def _require_check(self) -> CheckRecord:
        if self.current is None:
            raise RuntimeError("the recorder is only usable inside a conformance test")
        return self.current


class HarnessSession:
    """State of one run, kept in ``config.stash`` by the plugin and used by certify."""

    def __init__(
        self, spec: StackSpec, *, seed: int, report_dir: Path | None, command: str
    ) -> None:
        from conformance.profiles import load_profile

        self.spec = spec
        self.seed = seed
        self.report_dir = report_dir
        self.command = command
        self.profile = load_profile(spec.profile)
        self.recorder = Recorder(self)
        self.checks: list[dict[str, Any]] = []
        self.crash: str | None = None
        self.final_report: dict[str, Any] | None = None
        #: the RL smoke run's summary, with ``curves_path`` relative to the report folder
        self.rl: dict[str, Any] | None = None
        #: engines and backends started so far, by their option changes (``()``: the stack's own)
        self._engines: dict[tuple[Any, ...], Guarded] = {}
        self._backends: dict[tuple[Any, ...], Guarded] = {}
        self._infos: dict[str, dict[str, Any]] = {}
        self._model_info: Any = None
        self._started = dt.datetime.now(dt.UTC)
        self._clock = time.perf_counter()
        #: seconds spent starting engines and backends and inside their calls; everything else
        #: in the wall time is the harness's own overhead
        self.timing = dict.fromkeys(
            ("engine_start_s", "engine_s", "backend_start_s", "backend_s"), 0.0
        )
        if report_dir is not None:
            report_dir.mkdir(parents=True, exist_ok=True)
            (report_dir / "results.jsonl").write_text("")

    # -- the stack, started lazily and once ---------------------------------------------
    @property
    def model_info(self) -> Any:
        if self._model_info is None:
            from conformance.models import inspect_model

            self._model_info = inspect_model(self.spec.model_dir())
        return self._model_info

    @property
    def engine(self) -> Engine:
        """The engine under test, started on first use."""
        return self.engine_variant()

    def engine_variant(self, **option_changes: str) -> Engine:
        """The engine under test started with ``option_changes`` on top of its own options
        (strings, as ``--engine-option`` gives them), guarded and timed like it.

        Each distinct variant starts once. Variants hold memory (a KV cache each), so starting
        one closes the variant before it; the stack's own engine stays.
        """
        key = tuple(sorted(option_changes.items()))
        if key not in self._engines:
            for old in [k for k in self._engines if k]:
                self._engines.pop(old).close()
            config = self.spec.engine_config(self.model_info.path, **option_changes)
            self._engines[key] = self._start("engine", self.spec.engine, ENGINES, config, key)
        return self._engines[key]

    def backend_variant(self, **changes: Any) -> Backend:
        """The backend, or a variant of it (e.g. another micro-batch size), built once each.

        ``options={KEY: VALUE}`` changes backend options on top of the stack's own (strings, as
        ``--backend-option`` gives them).
        """
        key = tuple(sorted((k, _hashable(v)) for k, v in changes.items()))
        if key not in self._backends:
            config = self.spec.backend_config(self.model_info.path, **changes)
            self._backends[key] = self._start("backend", self.spec.backend, BACKENDS, config, key)
        return self._backends[key]

    @property
    def backend(self) -> Backend:
        return self.backend_variant()

    def _start(self, kind: str, name: str, registry: Any, config: Any, key: tuple) -> Guarded:
        """Build a component within the call deadline; a failure to start ends the run.

        Start time is the component's own work, booked to ``timing[kind + "_start_s"]``.
        """
        if self.crash is not None:
            raise EngineCrashed(f"the stack crashed earlier: {self.crash}", "see results.jsonl")
        component_cls = registry.get(name)
        started = time.perf_counter()
        try:
            with deadline(self.spec.call_timeout, f"starting {kind} {name!r}"):
                inner = component_cls(config)
        except ConformanceError as exc:
            if not key:
                # the stack as given cannot be built (a bad option, say): nothing can be
                # measured, so the run ends with this one reason instead of an error per test
                self._on_crash(f"{kind} {name!r} cannot start: {exc}")
            raise
        except (Exception, CallTimedOut) as exc:
            # no engine or backend means no measurement: the rest is skipped, not errored
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = f"{kind} {name!r} failed to start: {first}"
            self._on_crash(reason)
            raise EngineUnavailable(
                reason, getattr(exc, "fix", "") or f"see the {kind}'s log above"
            ) from exc
        finally:
            self.timing[f"{kind}_start_s"] += time.perf_counter() - started
        guarded = Guarded(
            inner,
            kind=kind,
            on_crash=self._on_crash,
            timing=self.timing,
            deadline_s=self.spec.call_timeout,
        )
        info = guarded.info()
        if not key:
            # kept for the report, which is written after everything has been closed
            self._infos[kind] = info
        self.log(event=f"{kind}_started", changes=dict(key), info=info)
        return guarded

    def _on_crash(self, reason: str) -> None:
        if self.crash is None:
            self.crash = reason
        self.log(event="crash", reason=reason)

    def close(self) -> None:
        """Close every engine and backend started; one failing to close does not keep the
        others open."""
        for component in [*self._engines.values(), *self._backends.values()]:
            try:
                component.close()
            except Exception as exc:
                self.log(event="close_failed", kind=component.kind, error=repr(exc))
        self._engines.clear()
        self._backends.clear()

    # -- recording -----------------------------------------------------------------------
    def log(self, **event: Any) -> None:
        if self.report_dir is None:
            return
        with (self.report_dir / "results.jsonl").open("a") as stream:
            stream.write(json.dumps(event, default=str) + "\n")

    @contextmanager
    def check(self, suite: str, name: str, nodeid: str) -> Iterator[CheckRecord]:
        record = CheckRecord(suite=suite, name=name, nodeid=nodeid)
        self.recorder.current = record
        try:
            yield record
        finally:
            self.recorder.current = None

    def finish_check(self, record: CheckRecord, status: str, message: str) -> dict[str, Any]:
        metrics = record.pooled()
        case = record.failing_case or (record.worst[1] if record.worst else None)
        entry = {
            "suite": record.suite,
            "name": record.name,
            "nodeid": record.nodeid,
            "status": status,
            "message": message,
            "metrics": metrics,
            "thresholds": {k: v for k, v in self.profile.thresholds.items() if k in metrics},
            "violations": [v.__dict__ for v in self.profile.check(metrics)] if metrics else [],
            "worst_case": {**case, "replay": self.replay_command(record.nodeid)} if case else None,
            "worst_case_metrics": record.failing_metrics
            or (record.worst[2] if record.worst else None),
            "samples": _samples(record),
            "examples_run": record.examples_run,
        }
        self.checks.append(entry)
        self.log(event="check", **{k: v for k, v in entry.items() if k != "samples"})
        return entry

    def replay_command(self, nodeid: str) -> str:
        args = ["pytest", nodeid, *self.spec.pytest_args(), f"--hypothesis-seed={self.seed}"]
        return shlex.join(args)

    # -- the summary ---------------------------------------------------------------------
    def verdict(self) -> tuple[str, str | None]:
        statuses = [c["status"] for c in self.checks]
        if self.crash is not None:
            measured = sum(1 for c in self.checks if c["metrics"])
            return "incomplete", f"{self.crash} ({measured} checks measured)"
        if "error" in statuses:
            errored = [c["nodeid"] for c in self.checks if c["status"] == "error"]
            return "incomplete", f"{len(errored)} check(s) errored: {', '.join(errored)}"
        if "fail" in statuses:
            return "fail", None
        if "pass" not in statuses:
            return "incomplete", "no check ran"
        return "pass", None

    def report(self) -> dict[str, Any]:
        verdict, reason = self.verdict()
        engine_info, backend_info = self._infos.get("engine", {}), self._infos.get("backend", {})
        return {
            "schema": 1,
            "verdict": verdict,
            "reason": reason,
            "created": self._started.isoformat(timespec="seconds"),
            "command": self.command,
            "seed": self.seed,
            "examples": self.spec.examples,
            "stack": fingerprint(self.spec, self.model_info, engine_info, backend_info),
            "profile": {
                "name": self.profile.name,
                "source": str(self.profile.source),
                "thresholds": self.profile.thresholds,
            },
            "checks": self.checks,
            "timing": self._timing(),
            "rl": self.rl,
        }

    def _timing(self) -> dict[str, float]:
        """Wall time of the run, the seconds the engines and backends spent starting and
        computing, and the harness's overhead: the rest of the wall time, per second of that."""
        compute = sum(self.timing.values())
        wall = time.perf_counter() - self._clock
        return {
            "wall_s": round(wall, 3),
            **{k: round(v, 3) for k, v in self.timing.items()},
            "harness_overhead": round((wall - compute) / compute, 4) if compute else 0.0,
        }

    def write_report(self) -> dict[str, Any]:
        report = self.report()
        self.log(event="session_end", verdict=report["verdict"], reason=report["reason"])
        if self.report_dir is not None:
            path = self.report_dir / "report.json"
            path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        return report


def _describe(violations: Sequence[Any]) -> str:
    return "; ".join(
        f"{v.metric} = {v.value:.4g} {'>' if v.bound == 'max' else '<'} {v.threshold:.4g}"
        for v in violations
    )


def _hashable(value: Any) -> Any:
    return tuple(sorted(value.items())) if isinstance(value, dict) else value


def _float_rows(rows: Sequence[Any]) -> list[list[float]]:
    return [row.tolist() if hasattr(row, "tolist") else [float(v) for v in row] for row in rows]


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)


def _samples(record: CheckRecord) -> dict[str, list[float]] | None:
    """Evenly down-sample the pooled token points to at most MAX_SAMPLES, deterministically."""
    points = [
        (t, i, p)
        for train, infer, pos in zip(
            record.lp_train, record.lp_infer, record.positions, strict=True
        )
        for t, i, p in zip(train, infer, pos, strict=True)
    ]
    if not points:
        return None
    stride = max(1, -(-len(points) // MAX_SAMPLES))
    kept = points[::stride]
    return {
        "lp_train": [p[0] for p in kept],
        "lp_infer": [p[1] for p in kept],
        "position": [p[2] for p in kept],
    }
