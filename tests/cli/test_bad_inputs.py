"""Every certify input is checked before anything starts: a bad option value or profile field is
one line naming the fix, exit 2, no traceback, and no report folder created (issue 55).

certify runs in-process (``conformance.cli.main``): a bad input stops it before an engine, a
calibration or pytest starts, so each drawn example costs milliseconds. A value these strategies
draw that certify took for a good one would start a whole run and fail the exit-code assertion.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.backends import BACKENDS
from conformance.cli import main
from conformance.depth import DEPTHS
from conformance.dtypes import canonical_dtype
from conformance.engines import ENGINES, LogprobKind
from conformance.errors import UsageError
from conformance.metric_table import METRICS
from conformance.models.cache import EMBEDDED_MODELS
from conformance.options import ATTN_CHOICES, STACK_OPTIONS
from conformance.profiles import available_profiles, load_profile
from conformance.rl.options import OLD_LOGPROBS, TRAINING_OPTIONS
from conformance.suites_location import suites_folder

SUITES = {p.stem.removeprefix("test_") for p in suites_folder().glob("test_*.py")}
#: a name-like word: what a user mistypes for a name
WORD = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


def words_but(valid: set[str]) -> st.SearchStrategy[str]:
    return WORD.filter(lambda w: w not in valid)


def _is_dtype(word: str) -> bool:
    try:
        canonical_dtype(word)
    except UsageError:
        return False
    return True


#: not a positive whole number: zero or less, a fraction, a word
BAD_COUNTS = st.one_of(
    st.integers(max_value=0).map(str),
    st.floats(allow_nan=True).filter(lambda x: not (math.isfinite(x) and x == int(x))).map(repr),
    WORD,
)
#: not a positive finite number
BAD_SECONDS = st.one_of(
    st.floats(max_value=0.0).map(repr), st.sampled_from(["inf", "nan", "-inf"]), WORD
).filter(lambda text: not _positive_finite(text))


def _positive_finite(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


@st.composite
def bad_paths(draw: st.DrawFn, root: Path, *, new_ok: bool = False) -> str:
    """A path no run can read (or, with ``new_ok``, write: where a new folder is good): missing,
    a file, a path under a file, or one under /proc, where nothing can be created."""
    kinds = ["file", "under-file", "proc"] + ([] if new_ok else ["missing"])
    kind, name = draw(st.sampled_from(kinds)), draw(WORD)
    if kind == "missing":
        return str(root / "missing" / name)
    if kind == "proc":
        return f"/proc/{name}/{name}"
    afile = root / "afile"
    afile.write_text("not a folder\n")
    return str(afile if kind == "file" else afile / name)


def _toml(value: object) -> str:
    if isinstance(value, float):
        return repr(value)  # inf, -inf and nan are TOML's spellings too
    if isinstance(value, str):
        return f'"{value}"'
    return str(value).lower() if isinstance(value, bool) else str(value)


@st.composite
def bad_profiles(draw: st.DrawFn) -> str:
    """A profile file's text with one field a profile cannot hold."""
    fact = draw(st.sampled_from(METRICS))
    past = draw(st.floats(min_value=1e-9, max_value=1e6))
    # a bound its own ideal value violates; for a two-sided bound, none is: it takes a non-number
    wrong_side = {"max": fact.ideal - past, "min": fact.ideal + past}.get(fact.bound, math.nan)
    not_a_number = draw(st.sampled_from([math.nan, "0.1", True, [0.1]]))
    field = draw(
        st.sampled_from(
            [
                f"{fact.name} = {_toml(wrong_side)}",
                f"{fact.name} = {_toml(not_a_number)}",
                f"{fact.name} = {_toml(draw(st.sampled_from([math.inf, -math.inf])))}",
                f"[suites.{draw(WORD)}]\n{fact.name} = {_toml(wrong_side)}",
                f"{draw(words_but({m.name for m in METRICS}))} = 0.1",
                f"min_pooled_tokens = {_toml(draw(st.sampled_from([0, -5, 2.5, 'x'])))}",
                f"max_pooled_tokens = {_toml(draw(st.sampled_from([0, -1, 1e3, 'many'])))}",
                f"description = {_toml(draw(st.sampled_from([3, 1.5, True])))}",
                f"provenance = {_toml(draw(st.sampled_from([1, 'x'])))}",
                f"suites = {_toml(draw(st.sampled_from([3, 'rollout_parity'])))}",
                f"{fact.name} == 0.1",
            ]
        )
    )
    return f'description = "drawn"\n{field}\n' if not field.startswith("description") else field


def bad_option(root: Path) -> st.SearchStrategy[list[str]]:
    """One certify option with a value certify must refuse, as command-line words."""
    profile_file = root / "profile.toml"

    def with_profile(text: str) -> list[str]:
        profile_file.write_text(text)
        return [f"--profile={profile_file}"]

    def option(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
        return values.map(lambda v: [f"--{name}={v}"])

    by_name: dict[str, st.SearchStrategy[list[str]]] = {
        "engine": option(
            "engine", words_but(set(ENGINES.names())) | st.just("no_such_module:Engine")
        ),
        "backend": option("backend", words_but(set(BACKENDS.names()))),
        "model": option(
            "model",
            bad_paths(root) | words_but(set(EMBEDDED_MODELS)).map("embedded:{}".format),
        ),
        "engine-dtype": option("engine-dtype", WORD.filter(lambda w: not _is_dtype(w))),
        "backend-dtype": option("backend-dtype", WORD.filter(lambda w: not _is_dtype(w))),
        "profile": st.one_of(
            option("profile", words_but(set(available_profiles()))),
            option("profile", bad_paths(root).map(lambda p: p + ".toml")),
            bad_profiles().map(with_profile),
        ),
        "depth": option("depth", words_but(set(DEPTHS))),
        "shrink-seconds": option("shrink-seconds", BAD_SECONDS),
        "logprobs": option("logprobs", words_but({k.value for k in LogprobKind})),
        # no '=', or no key; or a key the engine does not take
        "engine-option": option(
            "engine-option", WORD | WORD.map("={}".format) | WORD.map("x_{}=1".format)
        ),
        "engine-url": option("engine-url", WORD | WORD.map("{}:8000".format)),
        "backend-attn": option("backend-attn", words_but(set(ATTN_CHOICES))),
        "backend-option": option(
            "backend-option", WORD | WORD.map("={}".format) | WORD.map("x_{}=1".format)
        ),
        "call-timeout": option("call-timeout", BAD_SECONDS),
        "start-timeout": option("start-timeout", BAD_SECONDS),
        # the counts: examples, micro-batch, the run shape's
        **{o.name: option(o.name, BAD_COUNTS) for o in STACK_OPTIONS if o.metavar == "N"},
    }
    missing = {o.name for o in STACK_OPTIONS} - set(by_name)
    assert not missing, f"no bad values drawn for {missing}"
    training = {
        "updates-per-step": BAD_COUNTS,
        "old-logprobs": words_but(set(OLD_LOGPROBS)),
        "clip-low": st.one_of(
            st.floats(max_value=-1e-9).map(repr),
            st.floats(min_value=1.0).map(repr),
            st.sampled_from(["nan", "x"]),
        ),
        "clip-high": st.one_of(st.floats(max_value=-1e-9).map(repr), st.just("nan")),
    }
    assert set(training) == {o.name for o in TRAINING_OPTIONS}
    return st.one_of(
        *by_name.values(),
        option("seed", BAD_COUNTS.filter(lambda v: not v.lstrip("-").isdigit())),
        option("out", bad_paths(root, new_ok=True)),
        option("suites", bad_paths(root)),
        option("suite", words_but(SUITES)),
        # a training option is refused without --rl-smoke, and a bad value with it
        st.sampled_from(TRAINING_OPTIONS).map(lambda o: [f"--{o.name}=1"]),
        *(
            option(name, values).map(lambda a: ["--rl-smoke", *a])
            for name, values in training.items()
        ),
    )


def run_cli(
    capsys: pytest.CaptureFixture[str], command: str, args: list[str]
) -> tuple[int, list[str]]:
    """``command``'s exit code and its output lines (stdout and stderr), run in this process."""
    capsys.readouterr()
    code = main([command, *args])
    captured = capsys.readouterr()
    return code, [line for line in (captured.out + captured.err).splitlines() if line.strip()]


def assert_refused(code: int, lines: list[str], folder: Path, before: set[Path]) -> None:
    """One line, exit 2, and nothing written in ``folder`` (which held ``before``)."""
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("tim-conformance: error: ") and "Traceback" not in lines[0]
    assert set(folder.rglob("*")) == before, "it wrote into the folder it was run from"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of its own to run certify from: no pyproject.toml table reaches the run."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_bad_input_is_one_line_before_anything_starts(data, workdir, capsys):
    args = data.draw(bad_option(workdir), label="bad option")
    before = set(workdir.rglob("*"))
    code, lines = run_cli(capsys, "certify", ["--out", str(workdir / "run"), *args])
    assert_refused(code, lines, workdir, before)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_check_refuses_a_path_that_holds_no_certificate_in_one_line(data, workdir, capsys):
    path = data.draw(bad_paths(workdir), label="certificate")
    before = set(workdir.rglob("*"))
    code, lines = run_cli(capsys, "check", [path])
    assert_refused(code, lines, workdir, before)


NEGATIVE_BOUND = "abs_diff_max = -1\n"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--profile", "neg.toml"], "abs_diff_max = -1"),
        (["--out", "afile"], "afile is a file"),
        (["--out", "afile/run"], "afile, a file"),
        # root writes through permissions: /proc takes no new folder for anyone
        (["--out", "/proc/tim-conformance/run"], "cannot be written"),
        (["--model", "/nonexistent/model"], "/nonexistent/model"),
        (["--profile", "no-such-profile"], "no-such-profile"),
        (["--engine", "no-such-engine"], "no-such-engine"),
        (["--engine-dtype", "int3"], "int3"),
        (["--examples", "zero"], "examples"),
        (["--engine-option", "novalue"], "KEY=VALUE"),
        (["--no-such-flag"], "--no-such-flag"),
        (["--suites", "/nonexistent/suites"], "/nonexistent/suites"),
        (["--max-new-tokens", "0"], "max-new-tokens"),
        (["--group-size", "16", "--max-batch", "8"], "--max-batch 16"),
        # the embedded model has 4,096 positions
        (["--max-prompt-len", "4000", "--max-new-tokens", "200"], "needs 4201 positions"),
    ],
)
def test_a_bad_input_is_one_line_naming_the_fix(workdir, capsys, args, named):
    (workdir / "neg.toml").write_text(NEGATIVE_BOUND)
    (workdir / "afile").write_text("a file\n")
    before = set(workdir.rglob("*"))
    code, lines = run_cli(capsys, "certify", ["--out", "run", *args])
    assert_refused(code, lines, workdir, before)
    assert named in lines[0] and "(fix: " in lines[0]


def test_a_negative_bound_is_refused_before_anything_starts_as_a_user_runs_it(tmp_path, cli_env):
    """As a user meets it: the command line, in a process of its own: one line, exit 2, and
    neither the report folder nor pytest's caches written."""
    (tmp_path / "neg.toml").write_text(NEGATIVE_BOUND)
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--profile", "neg.toml", "--out", "run"],
        capture_output=True,
        text=True,
        env=cli_env,
        cwd=tmp_path,
        timeout=120,
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, lines
    assert "abs_diff_max = -1 is below the ideal 0" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["neg.toml"]


@pytest.mark.parametrize(
    "text",
    [
        "abs_diff_max = 0\npcc = 1.0\n",  # the ideal itself: exact
        "pcc = -3.9\nrho_min = -1.3\n",  # past the range on the open side: bounds nothing
        "k1 = -0.01\nrho_mean = 0.99\n",  # two-sided: either side of the ideal
        "abs_diff_max = 0.5\n[suites.rollout_parity]\nabs_diff_max = inf\npcc = -inf\n",
    ],
)
def test_bounds_on_their_open_side_load(text, tmp_path):
    """What the range check lets through: what calibrate writes and the suite-table lift."""
    (tmp_path / "p.toml").write_text(text)
    assert load_profile(tmp_path / "p.toml").thresholds
