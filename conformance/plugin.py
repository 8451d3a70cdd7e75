"""pytest plugin: ``--tim-*`` options, the ``engine``/``backend``/``model``/``profile``/
``recorder`` fixtures, results streamed to ``--tim-report DIR``, and a verdict in the summary.

Cheap to load: nothing heavy is imported until a conformance fixture is used, and no engine
starts until a test asks for one. All state lives in one :class:`HarnessSession` in
``config.stash``; the hooks delegate to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conformance.options import STACK_OPTIONS, add_stack_options, pyproject_table, resolve
from conformance.rl.options import add_training_options

if TYPE_CHECKING:
    from conformance.session import HarnessSession
    from conformance.stack import StackSpec

GROUP = "tim-conformance"
PREFIX = "tim-"
REPORT_OPTION = "--tim-report"
RL_SMOKE_OPTION = "--tim-rl-smoke"
SESSION_KEY = pytest.StashKey["HarnessSession"]()
PREPARED_KEY = pytest.StashKey["PreparedStack"]()
ACTIVE_KEY = pytest.StashKey[bool]()


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
    if PREPARED_KEY in config.stash:
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


def activate(config: pytest.Config) -> HarnessSession:
    """Build the session (idempotent). Suites' conftest calls this so they run with no flags."""
    if SESSION_KEY in config.stash:
        return config.stash[SESSION_KEY]
    from hypothesis import Phase, core, settings
    from hypothesis.configuration import set_hypothesis_home_dir
    from hypothesis.internal.conjecture import engine as conjecture_engine

    from conformance.errors import ConformanceError
    from conformance.models.cache import cache_root
    from conformance.session import HarnessSession, new_seed
    from conformance.stack import StackSpec

    table = pyproject_table(Path(config.rootpath))
    report = config.getoption("tim_report") or config.getini("tim_report") or table.get("report")
    prepared = config.stash.get(PREPARED_KEY, None)
    # --hypothesis-seed is honoured; without it we draw one and force it, so it can be recorded
    seed = core.global_force_seed
    if seed is None:
        seed = new_seed()
        core.global_force_seed = seed
    try:
        if prepared is not None:
            spec, command = prepared.spec, prepared.command
        else:
            spec = StackSpec.from_options(resolve(_given(config), _ini_values(config), table))
            spec, command = spec.preflight(), _command(config)
        session = HarnessSession(
            spec,
            seed=seed,
            report_dir=Path(report) if report else None,
            command=command,
            rootdir=Path(config.rootpath),
        )
    except ConformanceError as exc:
        raise pytest.UsageError(str(exc)) from None
    # an explicit --hypothesis-profile keeps its own max_examples unless --tim-examples is
    # given (a prepared spec's examples are explicit)
    explicit_examples = (
        prepared is not None
        or any("examples" in t for t in (_ini_values(config), table))
        or config.getoption("tim_examples") is not None
    )
    # engines are slow and jittery (no deadline); the explain phase re-runs failing examples
    # many times for a hint the recorded minimal case already gives
    phases = tuple(p for p in settings().phases if p is not Phase.explain)
    # the report's seed is the one every example comes from: a derandomizing profile (Hypothesis
    # loads its "ci" one whenever CI is set) would draw from the test's source instead
    overrides: dict[str, Any] = {"deadline": None, "phases": phases, "derandomize": False}
    if explicit_examples or not config.getoption("hypothesis_profile", None):
        overrides["max_examples"] = spec.examples
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        # Hypothesis's files in the harness's cache, not .hypothesis/ in the folder the run
        # started in. Its example database is never read or written here: every run forces
        # its seed (Hypothesis keeps no examples then), which a replay command repeats
        set_hypothesis_home_dir(cache_root() / "hypothesis")
    settings.register_profile("tim-conformance", parent=settings(), **overrides)
    settings.load_profile("tim-conformance")
    # Hypothesis documents this limit as the one to patch; a rare failure can otherwise take
    # many minutes of engine calls to shrink
    conjecture_engine.MAX_SHRINKING_SECONDS = spec.shrink_seconds
    _terminate_as_interrupt(config, session)
    config.stash[SESSION_KEY] = session
    return session


def _terminate_as_interrupt(config: pytest.Config, session: HarnessSession) -> None:
    """SIGTERM ends the session as Ctrl-C does (:func:`conformance.guard.sigterm_as_interrupt`),
    its reason kept for the report, until pytest unconfigures."""
    from contextlib import ExitStack

    from conformance.guard import sigterm_as_interrupt

    def note() -> None:
        if session.interrupted is None:
            session.interrupted = "interrupted by SIGTERM"

    signals = ExitStack()
    signals.enter_context(sigterm_as_interrupt(note))
    config.add_cleanup(signals.close)


class PreparedStack:
    """A pytest plugin object carrying a stack spec built and preflighted by its caller
    (``tim-conformance certify``), so the harness session takes it as it is instead of
    building one from ``--tim-*`` flags: ``pytest.main(args, plugins=[PreparedStack(...)])``.
    """

    def __init__(self, spec: StackSpec, command: str) -> None:
        self.spec = spec
        #: the command the report records (certify's own, which names the stack)
        self.command = command

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[PREPARED_KEY] = self


def _command(config: pytest.Config) -> str:
    import shlex

    return shlex.join(["pytest", *config.invocation_params.args])


def _session(config: pytest.Config) -> HarnessSession:
    return activate(config)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if SESSION_KEY not in config.stash:
        return None
    session = config.stash[SESSION_KEY]
    spec = session.spec
    return [
        f"tim-conformance: engine={spec.engine} ({spec.engine_dtype}) "
        f"backend={spec.backend} ({spec.backend_dtype}) profile={session.profile.name} "
        f"model={spec.model or 'embedded default'} seed={session.seed}"
    ]


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tim(request: pytest.FixtureRequest) -> HarnessSession:
    """The conformance session: spec, profile, engine, backend variants, recorder."""
    return _session(request.config)


@pytest.fixture(scope="session")
def model(tim: HarnessSession) -> Any:
    """The model under test (``conformance.models.ModelInfo``)."""
    return tim.model_info


@pytest.fixture(scope="session")
def depth(tim: HarnessSession) -> Any:
    """How far the property search reaches (``conformance.depth.Depth``)."""
    return tim.spec.depth


@pytest.fixture(scope="session")
def profile(tim: HarnessSession) -> Any:
    """The active tolerance profile."""
    return tim.profile


@pytest.fixture(scope="session")
def engine(tim: HarnessSession) -> Any:
    """The engine under test, started once per session and closed at its end."""
    return tim.engine


@pytest.fixture(scope="session")
def shared_engine(tim: HarnessSession) -> Any:
    """The engine under test for a property that needs its answer to a request, not a fresh
    one: ``generate`` (seeded) and ``score`` answer with what the engine answered an earlier
    check making the same request, once per check (``conformance.shared_answers``)."""
    return tim.shared_engine


@pytest.fixture(scope="session")
def backend(tim: HarnessSession) -> Any:
    """The training backend, built once per session."""
    return tim.backend


@pytest.fixture(scope="session")
def recorder(tim: HarnessSession) -> Any:
    """Records the running test's measurements into the session's results (session-scoped, so
    Hypothesis examples share it; the plugin points it at the test being run)."""
    return tim.recorder


#: fixtures that need a working stack; once it crashed, tests using them are skipped
_STACK_FIXTURES = frozenset({"tim", "engine", "shared_engine", "backend", "recorder"})


def pytest_runtest_setup(item: pytest.Item) -> None:
    harness = item.config.stash.get(SESSION_KEY, None)
    if (
        harness is not None
        and harness.crash
        and _STACK_FIXTURES & set(getattr(item, "fixturenames", ()))
    ):
        pytest.skip(f"the stack crashed: {harness.crash}")


# -- hooks: turn each test using the recorder into a check ---------------------------------
_RECORD_KEY = pytest.StashKey[Any]()
_OUTCOME_KEY = pytest.StashKey[tuple[Any, BaseException | None]]()


_DESELECTED_CHECKS = pytest.StashKey[bool]()


def _is_check(item: pytest.Item) -> bool:
    return "recorder" in getattr(item, "fixturenames", ())


def pytest_deselected(items: Sequence[pytest.Item]) -> None:
    if items and any(_is_check(i) for i in items):
        items[0].config.stash[_DESELECTED_CHECKS] = True


def pytest_collection_finish(session: pytest.Session) -> None:
    """The run's scope: ``stack`` when it runs every suite file of the folders its checks come
    from with nothing deselected, else ``suites`` (a pass then certifies those suites only)."""
    harness = session.config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
    files = {Path(str(i.path)) for i in session.items if _is_check(i)}
    everything = {p for folder in {f.parent for f in files} for p in folder.glob("test_*.py")}
    partial = session.config.stash.get(_DESELECTED_CHECKS, False) or not everything <= files
    harness.scope = "suites" if partial else "stack"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    checks = [i for i in items if _is_check(i)]
    if checks and SESSION_KEY not in config.stash:
        # the harness sets Hypothesis's settings (no deadline, the example count) before test
        # modules are imported, which only a configured run does
        raise pytest.UsageError(
            f"{len(checks)} test(s) use the tim-conformance recorder but no tim-conformance "
            "option is set (fix: pass e.g. --tim-engine hf-generate, or set tim_* keys in "
            "pytest.ini or [tool.tim-conformance] in pyproject.toml)"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    session = item.config.stash.get(SESSION_KEY, None)
    if session is None or not _is_check(item):
        yield
        return
    suite = Path(str(item.path)).stem.removeprefix("test_")
    with session.check(suite, item.name, item.nodeid) as record:
        item.stash[_RECORD_KEY] = record
        yield
        from conformance.outcome import Outcome

        interrupted = Outcome("interrupted", session.interrupted or "interrupted")
        outcome, exc = item.stash.get(_OUTCOME_KEY, (interrupted, None))
        session.finish_check(record, outcome, exc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    record = item.stash.get(_RECORD_KEY, None)
    if record is None:
        return (yield)
    recorder = item.config.stash[SESSION_KEY].recorder
    with _watching_examples(item, recorder):
        result = yield
        test = getattr(item, "obj", None)
        if getattr(test, "hypothesis", None) is not None:
            from conformance.recorder import one_example_at_batch_size, run_at_top

            run_at_top(test, item.runtest)
            if item.get_closest_marker("tim_batch_buckets"):
                from conformance.strategies import batch_buckets

                session = item.config.stash[SESSION_KEY]
                for size in batch_buckets(session.spec.depth.max_batch):
                    with one_example_at_batch_size(test, size):
                        item.runtest()
    if record.examples_run:
        try:
            recorder.check_pooled()
        except AssertionError as exc:
            recorder.example_failed(exc)
            raise
    return result


@contextmanager
def _watching_examples(item: pytest.Item, recorder: Any) -> Iterator[None]:
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if _RECORD_KEY not in item.stash:
        return
    report = outcome.get_result()
    judged = _judge(report, call)
    if judged is None:
        return
    if judged[0].crashed or judged[0].fault:
        # one line on the terminal; a fault's traceback goes to results.jsonl
        if judged[0].fault:
            harness = item.config.stash[SESSION_KEY]
            harness.log_fault(item.nodeid, judged[1])
            where = f" in {harness.report_dir / 'results.jsonl'}" if harness.report_dir else ""
            report.longrepr = (
                f"{judged[0].message} (engine {harness.engine_release()}; traceback logged"
                f'{where}, event "fault")'
            )
        else:
            report.longrepr = judged[0].message
    previous = item.stash.get(_OUTCOME_KEY, None)
    # the first non-pass phase decides; a pass in "call" is final unless teardown errs
    if previous is None or (previous[0].status == "pass" and judged[0].status != "pass"):
        item.stash[_OUTCOME_KEY] = judged


def _judge(report: pytest.TestReport, call: pytest.CallInfo[None]) -> Any:
    from conformance.outcome import Outcome, classify

    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return Outcome("skip", reason.removeprefix("Skipped: ")), None
    if report.when == "call" and report.passed:
        return Outcome("pass", ""), None
    if report.failed and call.excinfo is not None:
        return classify(call.excinfo.value), call.excinfo.value
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    harness = session.config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED and harness.interrupted is None:
        harness.interrupted = "interrupted (Ctrl-C)"
    harness.close()
    harness.final_report = harness.write_report()
    if harness.report_dir is not None:
        _write_html(harness.final_report, harness.report_dir)


def _write_html(report: Any, out: Path) -> None:
    from conformance.report import write_html

    write_html(report, out / "report.html")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    harness = config.stash.get(SESSION_KEY, None)
    if harness is None or harness.final_report is None:
        return
    from conformance.summary import verdict_lines

    terminalreporter.section("tim-conformance")
    for line in verdict_lines(harness.final_report, harness.report_dir):
        terminalreporter.write_line(line)
