"""pytest plugin: ``--tim-*`` options, the ``engine``/``backend``/``model``/``profile``/
``recorder`` fixtures, results streamed to ``--tim-report DIR``, and a verdict in the summary.

Cheap to load: nothing heavy is imported until a conformance fixture is used, and no engine
starts until a test asks for one. The module only adds the options and registers one object:
a :class:`HarnessPlugin`, whose methods are the hooks and which holds the run's
:class:`~conformance.session.HarnessSession`, when a ``--tim-*`` option (or a suite folder's
conftest) asks for the harness; else an :class:`Unconfigured`, which refuses checks.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conformance.options import STACK_OPTIONS, add_stack_options, pyproject_table
from conformance.rl.options import add_training_options
from conformance.suites_location import shipped_suites

if TYPE_CHECKING:
    from conformance.backends.base import Backend
    from conformance.depth import Depth
    from conformance.engines.base import Engine
    from conformance.models.info import ModelInfo
    from conformance.outcome import Outcome
    from conformance.profiles import Profile
    from conformance.recorder import CheckRecord, Recorder
    from conformance.report.schema import Report
    from conformance.session import HarnessSession
    from conformance.shared_answers import SharedAnswers
    from conformance.stack import StackSpec

GROUP = "tim-conformance"
PREFIX = "tim-"
REPORT_OPTION = "--tim-report"
RL_SMOKE_OPTION = "--tim-rl-smoke"
#: the names the harness's plugin object is registered under, active or not
PLUGIN_NAME = "tim-conformance-harness"
UNCONFIGURED_NAME = "tim-conformance-unconfigured"


def pytest_addoption(parser: pytest.Parser) -> None:
    from conformance.env import STACK

    names = ", ".join(variable.name for variable in STACK)
    group = parser.getgroup(
        GROUP,
        f"training–inference mismatch conformance (environment: {names}; "
        "their meanings: tim-conformance certify --help)",
    )
    add_stack_options(group.addoption, prefix=PREFIX)
    group.addoption(
        REPORT_OPTION,
        dest="tim_report",
        default=None,
        metavar="DIR",
        help="stream results.jsonl and write report.json (and report.html) into DIR",
    )
    group.addoption(
        RL_SMOKE_OPTION,
        dest="tim_rl_smoke",
        action="store_true",
        default=False,
        help="also run the RL smoke suite: a short GRPO run on a copy of the stack (minutes)",
    )
    add_training_options(group.addoption, prefix=PREFIX)  # the RL smoke suite's training regime
    for option in STACK_OPTIONS:
        parser.addini(option.dest, option.help_text())
    parser.addini("tim_report", "default for --tim-report")


def _ini_values(config: pytest.Config) -> dict[str, Any]:
    values = {}
    for option in STACK_OPTIONS:
        value = config.getini(option.dest)
        if value:
            values[option.name] = value
    return values


def _given(config: pytest.Config) -> dict[str, Any]:
    return {option.dest: config.getoption(option.dest) for option in STACK_OPTIONS}


def _configured(config: pytest.Config) -> bool:
    """Whether any source — a prepared spec, a flag, an ini key, ``[tool.tim-conformance]``
    — sets an option."""
    if _prepared(config) is not None:
        return True
    flags = any(v not in (None, []) for v in _given(config).values())
    report = config.getoption("tim_report") or config.getini("tim_report")
    return bool(flags or report or _ini_values(config) or pyproject_table(Path(config.rootpath)))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rl: the RL smoke suite (opt-in with --tim-rl-smoke)")
    config.addinivalue_line(
        "markers",
        "tim_batch_buckets: the property also runs one example at each power-of-two batch-size "
        "bucket of the depth (conformance.strategies.batch_buckets)",
    )
    if _configured(config):
        activate(config)
    elif config.pluginmanager.get_plugin(PLUGIN_NAME) is None:
        config.pluginmanager.register(Unconfigured(), UNCONFIGURED_NAME)


def activate(config: pytest.Config) -> HarnessSession:
    """Register the harness's plugin object (idempotent) and give its session. Suites'
    conftest calls this so they run with no flags."""
    plugins = config.pluginmanager
    harness = plugins.get_plugin(PLUGIN_NAME)
    if harness is None:
        harness = HarnessPlugin(config)
        unconfigured = plugins.get_plugin(UNCONFIGURED_NAME)
        if unconfigured is not None:
            plugins.unregister(unconfigured)
        plugins.register(harness, PLUGIN_NAME)
    return harness.session


def _build_spec(config: pytest.Config, table: dict[str, Any]) -> tuple[StackSpec, str]:
    """The stack spec and the command the report records: certify's prepared ones, else built
    from the ``--tim-*`` flags, ini keys and ``[tool.tim-conformance]``."""
    from conformance.preflight import preflight
    from conformance.stack import StackSpec

    prepared = _prepared(config)
    if prepared is not None:
        spec, command = prepared.spec, prepared.command
    else:
        spec = StackSpec.from_options(_given(config), _ini_values(config), table)
        spec, command = preflight(spec), _command(config)
    return spec, command


@contextmanager
def hypothesis_settings(spec: StackSpec, *, examples: bool) -> Iterator[int]:
    """Hypothesis as the harness runs it, inside the block; what it was is back when the block
    ends. Yields the seed every example comes from: ``--hypothesis-seed``'s, or one drawn and
    forced so that the report can record it. ``examples``: the spec's example count replaces
    the loaded profile's ``max_examples``.
    """
    from hypothesis import Phase, core, settings
    from hypothesis.configuration import set_hypothesis_home_dir
    from hypothesis.internal.conjecture import engine as conjecture_engine

    from conformance.models.cache import cache_root
    from conformance.session import new_seed

    forced, profile = core.global_force_seed, settings.get_current_profile_name()
    shrinking = conjecture_engine.MAX_SHRINKING_SECONDS
    seed = forced if forced is not None else new_seed()
    # engines are slow and jittery (no deadline); the explain phase re-runs failing examples
    # many times for a hint the recorded minimal case already gives
    phases = tuple(p for p in settings().phases if p is not Phase.explain)
    # the report's seed is the one every example comes from: a derandomizing profile (Hypothesis
    # loads its "ci" one whenever CI is set) would draw from the test's source instead
    overrides: dict[str, Any] = {"deadline": None, "phases": phases, "derandomize": False}
    if examples:
        overrides["max_examples"] = spec.examples
    # Hypothesis's files in the harness's cache, not .hypothesis/ in the folder the run
    # started in. Its example database is never read or written here: every run forces its
    # seed (Hypothesis keeps no examples then), which a replay command repeats
    home = not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
    core.global_force_seed = seed
    if home:
        set_hypothesis_home_dir(cache_root() / "hypothesis")
    settings.register_profile("tim-conformance", parent=settings(), **overrides)
    settings.load_profile("tim-conformance")
    # Hypothesis documents this limit as the one to patch; a rare failure can otherwise take
    # many minutes of engine calls to shrink
    conjecture_engine.MAX_SHRINKING_SECONDS = spec.shrink_seconds
    try:
        yield seed
    finally:
        conjecture_engine.MAX_SHRINKING_SECONDS = shrinking
        settings.load_profile(profile)
        if home:
            set_hypothesis_home_dir(None)
        core.global_force_seed = forced


class PreparedStack:
    """A pytest plugin object carrying a stack spec built and preflighted by its caller
    (``tim-conformance certify``), so the harness session takes it as it is instead of
    building one from ``--tim-*`` flags: ``pytest.main(args, plugins=[PreparedStack(...)])``.
    It hands the caller back the report the run wrote (:attr:`report`).
    """

    def __init__(self, spec: StackSpec, command: str) -> None:
        self.spec = spec
        #: the command the report records (certify's own, which names the stack)
        self.command = command
        self._report: Report | None = None

    @property
    def report(self) -> Report | None:
        """The report the run wrote; None where pytest stopped before the harness's session
        (an interrupt as it started, a usage error)."""
        return self._report

    def received(self, report: Report) -> None:
        """The run's report, as written."""
        self._report = report


def _prepared(config: pytest.Config) -> PreparedStack | None:
    plugins = config.pluginmanager.get_plugins()
    return next((p for p in plugins if isinstance(p, PreparedStack)), None)


def _command(config: pytest.Config) -> str:
    return shlex.join(["pytest", *config.invocation_params.args])


class Unconfigured:
    """Registered while no ``--tim-*`` option asks for the harness: a test using the recorder
    is refused at collection, since the harness sets Hypothesis's settings (no deadline, the
    example count) before test modules are imported, which only a configured run does."""

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        checks = [i for i in items if _is_check(i)]
        if checks:
            raise pytest.UsageError(
                f"{len(checks)} test(s) use the tim-conformance recorder but no tim-conformance "
                "option is set (fix: pass e.g. --tim-engine hf-generate, or set tim_* keys in "
                "pytest.ini or [tool.tim-conformance] in pyproject.toml)"
            )


#: fixtures that need a working stack; once it crashed, tests using them are skipped
_STACK_FIXTURES = frozenset({"tim", "engine", "shared_engine", "backend", "recorder"})


class HarnessPlugin:
    """The harness in a pytest run: builds the session from the run's options, turns each test
    using the recorder into a check, and writes the report when the run ends.

    Hypothesis's settings (:func:`hypothesis_settings`) and SIGTERM as an interrupt hold from
    here until pytest unconfigures.
    """

    def __init__(self, config: pytest.Config) -> None:
        from conformance.errors import ConformanceError
        from conformance.guard import sigterm_as_interrupt
        from conformance.session import HarnessSession

        table = pyproject_table(Path(config.rootpath))
        #: certify's prepared stack, where certify started the run: it gets the report back
        self._prepared = _prepared(config)
        report = (
            config.getoption("tim_report") or config.getini("tim_report") or table.get("report")
        )
        restore = ExitStack()
        config.add_cleanup(restore.close)
        try:
            spec, command = _build_spec(config, table)
            # an explicit --hypothesis-profile keeps its own max_examples unless --tim-examples
            # is given (a prepared spec's examples are explicit)
            examples = (
                self._prepared is not None
                or any("examples" in t for t in (_ini_values(config), table))
                or config.getoption("tim_examples") is not None
                or not config.getoption("hypothesis_profile", None)
            )
            seed = restore.enter_context(hypothesis_settings(spec, examples=examples))
            self.session = HarnessSession(
                spec,
                seed=seed,
                report_dir=Path(report) if report else None,
                command=command,
                rootdir=Path(config.rootpath),
            )
        except ConformanceError as exc:
            raise pytest.UsageError(str(exc)) from None
        restore.enter_context(sigterm_as_interrupt(self._terminated))
        #: the report written when the run ended, for the terminal summary
        self.final_report: Report | None = None
        self._deselected_checks = False
        #: the running check's record and how its phases ended so far (the first non-pass
        #: phase decides)
        self._record: CheckRecord | None = None
        self._outcome: tuple[Outcome, BaseException | None] | None = None

    def _terminated(self) -> None:
        self.session.report.note_interrupted("interrupted by SIGTERM")

    def pytest_report_header(self) -> list[str]:
        session = self.session
        spec = session.spec
        return [
            f"tim-conformance: engine={spec.engine} ({spec.engine_dtype}) "
            f"backend={spec.backend} ({spec.backend_dtype}) profile={session.profile.name} "
            f"model={spec.model or 'embedded default'} seed={session.seed}"
        ]

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        if any(_is_check(i) for i in items):
            self._deselected_checks = True

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The run's scope: ``stack`` when it runs every suite the harness ships and every
        suite file of the folders its checks come from, with nothing deselected; else
        ``suites`` (a pass then certifies those suites only). A folder of one's own suites
        certifies a stack only beside every shipped one: a folder holding some of them is
        some of the properties."""
        files = {Path(str(i.path)) for i in session.items if _is_check(i)}
        everything = {p for folder in {f.parent for f in files} for p in folder.glob("test_*.py")}
        ran = {f.stem.removeprefix("test_") for f in files}
        partial = self._deselected_checks or not everything <= files or not shipped_suites() <= ran
        self.session.report.record_scope("suites" if partial else "stack")

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        crash = self.session.stack.crash
        if crash and _STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            pytest.skip(f"the stack crashed: {crash}")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        if not _is_check(item):
            yield
            return
        from conformance.outcome import Outcome

        session = self.session
        suite = Path(str(item.path)).stem.removeprefix("test_")
        with session.check(suite, item.name, item.nodeid) as record:
            self._record, self._outcome = record, None
            try:
                yield
            finally:
                self._record = None
            interrupted = Outcome("interrupted", session.report.interrupted or "interrupted")
            outcome, exc = self._outcome or (interrupted, None)
            session.report.finish_check(record, outcome, exc)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        record = self._record
        if record is None:
            return (yield)
        recorder = self.session.recorder
        with _watching_examples(item, recorder):
            result = yield
            test = getattr(item, "obj", None)
            if getattr(test, "hypothesis", None) is not None:
                from conformance.recorder import one_example_at_batch_size, run_at_top

                run_at_top(test, item.runtest)
                if item.get_closest_marker("tim_batch_buckets"):
                    from conformance.strategies import batch_buckets

                    for size in batch_buckets(self.session.spec.depth.max_batch):
                        with one_example_at_batch_size(test, size):
                            item.runtest()
        if record.examples_run:
            try:
                recorder.check_pooled()
            except AssertionError as exc:
                recorder.example_failed(exc)
                raise
        return result

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[None]:
        outcome = yield
        if self._record is None:
            return
        report = outcome.get_result()
        judged = _judge(report, call)
        if judged is None:
            return
        if judged[0].crashed or judged[0].fault:
            # one line on the terminal; a fault's traceback goes to results.jsonl
            if judged[0].fault:
                session = self.session
                session.log_fault(item.nodeid, judged[1])
                where = f" in {session.report_dir / 'results.jsonl'}" if session.report_dir else ""
                report.longrepr = (
                    f"{judged[0].message} (engine {session.stack.engine_release()}; traceback "
                    f'logged{where}, event "fault")'
                )
            else:
                report.longrepr = judged[0].message
        previous = self._outcome
        # the first non-pass phase decides; a pass in "call" is final unless teardown errs
        if previous is None or (previous[0].status == "pass" and judged[0].status != "pass"):
            self._outcome = judged

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.session.report.note_interrupted("interrupted (Ctrl-C)")
        self.session.close()
        self.final_report = self.session.report.write()
        if self._prepared is not None:
            self._prepared.received(self.final_report)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.final_report is None:
            return
        from conformance.report.summary import verdict_lines

        terminalreporter.section("tim-conformance")
        for line in verdict_lines(self.final_report, self.session.report_dir):
            terminalreporter.write_line(line)


def _is_check(item: pytest.Item) -> bool:
    return "recorder" in getattr(item, "fixturenames", ())


@contextmanager
def _watching_examples(item: pytest.Item, recorder: Recorder) -> Iterator[None]:
    """Bracket every example the test runs — each Hypothesis example, or the one call of a
    plain test — so the recorder knows which case failed and how long shrinking took."""
    function = getattr(item, "obj", None)
    hypothesis = getattr(function, "hypothesis", None)
    if hypothesis is None:
        recorder.begin_example()
        try:
            yield
        except BaseException as exc:
            recorder.example_failed(exc)
            raise
        finally:
            recorder.example_ended()
        return
    # Hypothesis calls ``inner_test`` once per example and lets plugins replace it
    inner = hypothesis.inner_test
    hypothesis.inner_test = recorder.watched(inner)
    try:
        yield
    finally:
        hypothesis.inner_test = inner


def _judge(
    report: pytest.TestReport, call: pytest.CallInfo[None]
) -> tuple[Outcome, BaseException | None] | None:
    from conformance.outcome import Outcome, classify

    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return Outcome("skip", reason.removeprefix("Skipped: ")), None
    if report.when == "call" and report.passed:
        return Outcome("pass", ""), None
    if report.failed and call.excinfo is not None:
        return classify(call.excinfo.value), call.excinfo.value
    return None


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tim(request: pytest.FixtureRequest) -> HarnessSession:
    """The conformance session: spec, profile, engine, backend variants, recorder."""
    return activate(request.config)


@pytest.fixture(scope="session")
def model(tim: HarnessSession) -> ModelInfo:
    """The model under test (``conformance.models.ModelInfo``)."""
    return tim.model_info


@pytest.fixture(scope="session")
def depth(tim: HarnessSession) -> Depth:
    """How far the property search reaches (``conformance.depth.Depth``)."""
    return tim.spec.depth


@pytest.fixture(scope="session")
def profile(tim: HarnessSession) -> Profile:
    """The active tolerance profile."""
    return tim.profile


@pytest.fixture(scope="session")
def engine(tim: HarnessSession) -> Engine:
    """The engine under test, started once per session and closed at its end."""
    return tim.engine


@pytest.fixture(scope="session")
def shared_engine(tim: HarnessSession) -> SharedAnswers:
    """The engine under test for a property that needs its answer to a request, not a fresh
    one: ``generate`` (seeded) and ``score`` answer with what the engine answered an earlier
    check making the same request, once per check (``conformance.shared_answers``)."""
    return tim.shared_engine


@pytest.fixture(scope="session")
def backend(tim: HarnessSession) -> Backend:
    """The training backend, built once per session."""
    return tim.backend


@pytest.fixture(scope="session")
def recorder(tim: HarnessSession) -> Recorder:
    """Records the running test's measurements into the session's results (session-scoped, so
    Hypothesis examples share it; the plugin points it at the test being run)."""
    return tim.recorder


@pytest.fixture(scope="session")
def rl_summary(tim: HarnessSession) -> Callable[[dict[str, Any]], None]:
    """Records an RL smoke run's summary (``RunSummary.as_dict()``, with ``curves_path``
    relative to the report folder) as report.json's ``rl``."""
    return tim.report.record_rl
