"""pytest plugin: ``--tim-*`` options, the ``engine``/``backend``/``model``/``profile``/
``recorder`` fixtures, results streamed to ``--tim-report DIR``, and a verdict in the summary.

Cheap to load: nothing heavy is imported until a conformance fixture is used, and no engine
starts until a test asks for one. All state lives in one :class:`HarnessSession` in
``config.stash``; the hooks delegate to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conformance.options import STACK_OPTIONS, add_stack_options, pyproject_table, resolve
from conformance.rl.options import add_training_options

if TYPE_CHECKING:
    from conformance.session import HarnessSession

GROUP = "tim-conformance"
PREFIX = "tim-"
REPORT_OPTION = "--tim-report"
RL_SMOKE_OPTION = "--tim-rl-smoke"
SESSION_KEY = pytest.StashKey["HarnessSession"]()
ACTIVE_KEY = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "training–inference mismatch conformance")
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
        parser.addini(f"tim_{option.name.replace('-', '_')}", option.help)
    parser.addini("tim_report", "default for --tim-report")


def _ini_values(config: pytest.Config) -> dict[str, Any]:
    values = {}
    for option in STACK_OPTIONS:
        value = config.getini(f"tim_{option.name.replace('-', '_')}")
        if value:
            values[option.name] = value
    return values


def _given(config: pytest.Config) -> dict[str, Any]:
    return {option.dest: config.getoption(option.dest) for option in STACK_OPTIONS}


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rl: the RL smoke suite (opt-in with --tim-rl-smoke)")
    wanted = any(v not in (None, []) for v in _given(config).values()) or config.getoption(
        "tim_report"
    )
    if wanted:
        activate(config)


def activate(config: pytest.Config) -> HarnessSession:
    """Build the session (idempotent). Suites' conftest calls this so they run with no flags."""
    if SESSION_KEY in config.stash:
        return config.stash[SESSION_KEY]
    from hypothesis import Phase, core, settings

    from conformance.errors import ConformanceError
    from conformance.session import HarnessSession, new_seed
    from conformance.stack import StackSpec

    table = pyproject_table(Path(config.rootpath))
    values = resolve(_given(config), _ini_values(config), table)
    report = config.getoption("tim_report") or config.getini("tim_report") or table.get("report")
    # --hypothesis-seed is honoured; without it we draw one and force it, so it can be recorded
    seed = core.global_force_seed
    if seed is None:
        seed = new_seed()
        core.global_force_seed = seed
    try:
        spec = StackSpec.from_options(values)
        session = HarnessSession(
            spec,
            seed=seed,
            report_dir=Path(report) if report else None,
            command=_command(config),
        )
    except ConformanceError as exc:
        raise pytest.UsageError(str(exc)) from None
    # an explicit --hypothesis-profile keeps its own max_examples unless --tim-examples is given
    explicit_examples = any("examples" in t for t in (_ini_values(config), table)) or (
        config.getoption("tim_examples") is not None
    )
    # engines are slow and jittery (no deadline); the explain phase re-runs failing examples
    # many times for a hint the recorded minimal case already gives
    phases = tuple(p for p in settings().phases if p is not Phase.explain)
    overrides: dict[str, Any] = {"deadline": None, "phases": phases}
    if explicit_examples or not config.getoption("hypothesis_profile", None):
        overrides["max_examples"] = spec.examples
    settings.register_profile("tim-conformance", parent=settings(), **overrides)
    settings.load_profile("tim-conformance")
    config.stash[SESSION_KEY] = session
    return session


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
def profile(tim: HarnessSession) -> Any:
    """The active tolerance profile."""
    return tim.profile


@pytest.fixture(scope="session")
def engine(tim: HarnessSession) -> Any:
    """The engine under test, started once per session and closed at its end."""
    return tim.engine


@pytest.fixture(scope="session")
def backend(tim: HarnessSession) -> Any:
    """The training backend, built once per session."""
    return tim.backend


@pytest.fixture(scope="session")
def recorder(tim: HarnessSession) -> Any:
    """Records the running test's measurements into the session's results (session-scoped, so
    Hypothesis examples share it; the plugin points it at the test being run)."""
    return tim.recorder


def pytest_runtest_setup(item: pytest.Item) -> None:
    harness = item.config.stash.get(SESSION_KEY, None)
    if harness is not None and harness.crash and "engine" in getattr(item, "fixturenames", ()):
        pytest.skip(f"no engine: {harness.crash}")


# -- hooks: turn each test using the recorder into a check ---------------------------------
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    session = item.config.stash.get(SESSION_KEY, None)
    if session is None or "recorder" not in getattr(item, "fixturenames", ()):
        yield
        return
    suite = Path(str(item.path)).stem.removeprefix("test_")
    with session.check(suite, item.name, item.nodeid) as record:
        item.stash[_RECORD_KEY] = record
        yield
        status, message = item.stash.get(_STATUS_KEY, ("error", "not run"))
        session.finish_check(record, status, message)


_RECORD_KEY = pytest.StashKey[Any]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    record = item.stash.get(_RECORD_KEY, None)
    if record is not None and record.examples_run:
        item.config.stash[SESSION_KEY].recorder.check_pooled()
    return result


_STATUS_KEY = pytest.StashKey[tuple[str, str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if _RECORD_KEY not in item.stash:
        return
    report = outcome.get_result()
    status, message = _status(report, call)
    if status is None:
        return
    previous = item.stash.get(_STATUS_KEY, None)
    # the first non-pass phase decides; a pass in "call" is final unless teardown errs
    if previous is None or (previous[0] == "pass" and status != "pass"):
        item.stash[_STATUS_KEY] = (status, message)


def _status(report: pytest.TestReport, call: pytest.CallInfo[None]) -> tuple[Any, str]:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return "skip", reason.removeprefix("Skipped: ")
    if report.when == "call" and report.passed:
        return "pass", ""
    if report.failed:
        excinfo = call.excinfo
        if excinfo is not None and excinfo.errisinstance(AssertionError):
            return "fail", str(excinfo.value).splitlines()[0]
        text = str(excinfo.value).splitlines()[0] if excinfo and str(excinfo.value) else ""
        name = excinfo.typename if excinfo else "error"
        return "error", f"{name}: {text}"
    return None, ""


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    harness = session.config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
    harness.close()
    harness.final_report = harness.write_report()
    if harness.report_dir is not None:
        _write_html(harness.final_report, harness.report_dir)


def _write_html(report: dict[str, Any], out: Path) -> None:
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
