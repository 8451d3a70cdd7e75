"""The stack options, each declared once with its converter: pytest spells them ``--tim-NAME``
(ini key ``tim_NAME``, or ``NAME`` under ``[tool.tim-conformance]`` in pyproject.toml); the CLI
spells them ``--NAME``. :func:`resolve` turns what was given into each option's typed value (or
one line naming the fix), which :meth:`conformance.stack.StackSpec.from_options` assembles;
:func:`implied_profile` is the ``profile`` option's default where none is named.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    SupportsFloat,
    SupportsIndex,
    SupportsInt,
    TypeVar,
    cast,
)

from conformance.backends import BACKENDS
from conformance.depth import DEPTHS, Depth, depth
from conformance.dtypes import canonical_dtype, dtype_spellings
from conformance.engines import ENGINES, LogprobKind
from conformance.errors import UsageError
from conformance.hf_model import AUTO_ATTN
from conformance.models import model_folder
from conformance.profiles import available_profiles

#: an option's converter: (its name, the value given) to its typed value, or a UsageError
Convert = Callable[[str, object], object]

_Given = TypeVar("_Given")


def dest(name: str) -> str:
    """Where a parsed option ``--NAME`` / ``--tim-NAME`` lands (argparse's ``dest``, pytest's
    option name), which is also its ini key: ``tim_`` and the name in snake case."""
    return "tim_" + name.replace("-", "_")


def _as_given(name: str, value: _Given) -> _Given:
    return value


@dataclass(frozen=True)
class Option:
    name: str
    #: what it sets; ``--help`` adds its choices and its default
    help: str
    default: str | None = None
    metavar: str = "VALUE"
    multiple: bool = False
    #: the default in words where it is not one value (``None``: the default is ``default``)
    default_help: str | None = None
    #: the values ``--help`` lists, read when the help is built: a registry's names, so a new
    #: engine is listed by itself
    choices: Callable[[], Sequence[str]] | None = None
    #: the value given (text, or a list of texts for a repeatable option) to its typed value;
    #: an option that is not given and has no default is None, never converted
    convert: Convert = _as_given

    @property
    def dest(self) -> str:
        return dest(self.name)

    def typed(self, value: object) -> object:
        """``value``'s typed value; None stays None."""
        return None if value is None else self.convert(self.name, value)

    def default_value(self) -> Any:
        """The default's typed value (its type is the option's converter's, which the
        :class:`~conformance.stack.StackSpec` field it fills declares)."""
        return self.typed(self.default)

    def help_text(self) -> str:
        """``help``, the choices and the default, as ``--help`` shows them."""
        choices = f"; one of: {', '.join(self.choices())}" if self.choices else ""
        return f"{self.help}{choices} (default: {self.default_help or self.default})"


def _engines() -> list[str]:
    return [*ENGINES.names(), "your own module:Class"]


def _backends() -> list[str]:
    return [*BACKENDS.names(), "your own module:Class"]


def _profiles() -> list[str]:
    return [*available_profiles(), "a .toml file"]


def _dtypes() -> list[str]:
    return dtype_spellings()


def _logprob_kinds() -> list[str]:
    return [kind.value for kind in LogprobKind]


# The converters: each takes the option's name (for the line that refuses a value) and the value
# as given, which is text (the command line's, an ini file's, a certificate's) or, from a
# pyproject table, already a number.


def positive_int(name: str, value: object) -> int:
    try:
        number = int(value) if isinstance(value, (str, bytes, SupportsInt, SupportsIndex)) else 0
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise UsageError(f"--{name} {value!r} is not a positive integer", f"pass e.g. --{name} 10")
    return number


def positive_number(name: str, value: object) -> float:
    try:
        number = (
            float(value) if isinstance(value, (str, bytes, SupportsFloat, SupportsIndex)) else 0.0
        )
    except (TypeError, ValueError):
        number = 0.0
    if not (number > 0 and math.isfinite(number)):
        raise UsageError(f"--{name} {value!r} is not a positive number", f"pass e.g. --{name} 600")
    return number


def one_of(choices: Sequence[str]) -> Convert:
    def convert(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in choices:
            raise UsageError(
                f"--{name} {value!r} is not one of its choices", f"use {', '.join(choices)}"
            )
        return value

    return convert


def dtype(name: str, value: object) -> str:
    return canonical_dtype(str(value))


def depth_named(name: str, value: object) -> Depth:
    return depth(str(value))


def model_path(name: str, value: object) -> Path:
    """A ``--model`` value's folder (``embedded:NAME`` is built on first use)."""
    return model_folder(str(value))


def logprob_kind(name: str, value: object) -> LogprobKind:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return LogprobKind(value)
    raise UsageError(f"unknown logprobs kind {value!r}", "use raw or processed")


def key_values(what: str) -> Convert:
    """A repeatable KEY=VALUE option's pairs as a dict."""

    def convert(name: str, value: object) -> dict[str, str]:
        # :func:`resolve` gives a repeatable option the list of texts given
        return parse_key_values(list(cast("Iterable[str]", value)), what=what)

    return convert


def parse_key_values(pairs: list[str], *, what: str = "engine option") -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``."""
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {pair!r} is not KEY=VALUE", "write e.g. max_num_seqs=4")
        parsed[key.strip()] = value.strip()
    return parsed


def server_url(name: str, value: object) -> str:
    """An ``--engine-url``: http(s)://HOST[:PORT][/PATH], where a server answers."""
    url = str(value)
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 — reading it is what checks it
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"--{name} {value!r} is not an http(s) URL",
            f"pass e.g. --{name} http://localhost:8000",
        )
    return url


#: the attention implementations a backend may be asked for: transformers' own names (its
#: ``ALL_ATTENTION_FUNCTIONS`` and ``eager``), listed here since importing transformers to read
#: them would cost ``--help`` and every refusal seconds
ATTN_IMPLEMENTATIONS = (
    "sdpa",
    "eager",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
)
#: what ``--backend-attn`` takes: the model's own implementation (``auto``: SDPA where the model
#: supports it, else eager), or one of transformers' by name
ATTN_CHOICES = (AUTO_ATTN, *ATTN_IMPLEMENTATIONS)

ENGINE = Option("engine", "inference engine under test", "hf-generate", "E", choices=_engines)
BACKEND = Option(
    "backend", "training backend that recomputes logprobs", "hf", "B", choices=_backends
)
MODEL = Option(
    "model",
    "model folder, or embedded:moe",
    None,
    "DIR",
    default_help="the embedded tiny model",
    convert=model_path,
)
ENGINE_DTYPE = Option(
    "engine-dtype", "engine precision", "float32", "D", choices=_dtypes, convert=dtype
)
BACKEND_DTYPE = Option(
    "backend-dtype", "backend precision", "float32", "D", choices=_dtypes, convert=dtype
)
#: a precision (its canonical name) → the shipped profile a stack at that precision is held to
_PROFILE_OF = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: coarser precision first: the profile follows the least precise side
_COARSENESS = ("bfloat16", "float16", "float32")


def implied_profile(engine_dtype: str, backend_dtype: str, *, moe: bool = False) -> str:
    """The tolerance profile a stack is held to where it names none: that of its less precise
    side; for an MoE model the MoE one (``moe-bf16``), measured on the embedded MoE model:
    flipped routes make its mismatch a different population from a dense model's. The dtypes
    are canonical names (``float32``, ``bfloat16``, ``float16``), as a spec holds them.

    >>> implied_profile("bfloat16", "float32"), implied_profile("float32", "float32", moe=True)
    ('bf16', 'moe-fp32')
    """
    coarsest = min((engine_dtype, backend_dtype), key=_COARSENESS.index)
    return f"moe-{_PROFILE_OF[coarsest]}" if moe else _PROFILE_OF[coarsest]


PROFILE = Option(
    "profile",
    "tolerance profile",
    None,
    "P",
    default_help="implied by the dtypes (an MoE model's: their MoE profile); on a model or "
    "device the shipped ones were not calibrated on, the model's own, calibrated first and cached",
    choices=_profiles,
)
EXAMPLES = Option("examples", "Hypothesis examples per property", "20", "N", convert=positive_int)
DEPTH = Option(
    "depth",
    "how far the property search reaches: " + "; ".join(d.describe() for d in DEPTHS.values()),
    "quick",
    "NAME",
    choices=lambda: tuple(DEPTHS),
    convert=depth_named,
)
MAX_PROMPT_LEN = Option(
    "max-prompt-len",
    "the run's longest prompt: overrides the depth's (every property reaches it once)",
    None,
    "N",
    default_help="the depth's",
    convert=positive_int,
)
MAX_NEW_TOKENS = Option(
    "max-new-tokens",
    "the run's longest rollout: overrides the depth's (every property reaches it once)",
    None,
    "N",
    default_help="the depth's",
    convert=positive_int,
)
MAX_BATCH = Option(
    "max-batch",
    "the run's rollout batch (sequences): overrides the depth's",
    None,
    "N",
    default_help="the depth's",
    convert=positive_int,
)
GROUP_SIZE = Option(
    "group-size",
    "the run's GRPO group size (samples per prompt): grouped batches reach it",
    None,
    "N",
    default_help="the depth's",
    convert=positive_int,
)
MAX_BATCH_TOKENS = Option(
    "max-batch-tokens",
    "tokens one drawn batch holds, sequences x (longest prompt + new tokens): overrides the "
    "depth's",
    None,
    "N",
    default_help="the depth's, and on a CPU the smaller budget a costly model gets",
    convert=positive_int,
)
#: the options that give a run's own shape in place of the depth's limits
RUN_SHAPE_OPTIONS = (MAX_PROMPT_LEN, MAX_NEW_TOKENS, MAX_BATCH, GROUP_SIZE, MAX_BATCH_TOKENS)
SHRINK_SECONDS = Option(
    "shrink-seconds",
    "seconds Hypothesis may spend shrinking a failure to a minimal case; past them the report "
    "says the case was not fully shrunk",
    "60",
    "S",
    convert=positive_number,
)
LOGPROBS = Option(
    "logprobs",
    "which logprobs the engine is asked for",
    "raw",
    choices=_logprob_kinds,
    convert=logprob_kind,
)
ENGINE_OPTION = Option(
    "engine-option",
    "engine-specific setting, repeatable",
    None,
    "KEY=VALUE",
    multiple=True,
    default_help="the engine's own",
    convert=key_values("engine option"),
)
ENGINE_URL = Option(
    "engine-url",
    "attach to an engine server already running there (http://HOST:PORT)",
    None,
    "URL",
    default_help="the engine starts its own",
    convert=server_url,
)
BACKEND_MICRO_BATCH = Option(
    "backend-micro-batch", "backend micro-batch size", "8", "N", convert=positive_int
)
BACKEND_ATTN = Option(
    "backend-attn",
    "backend attention implementation (auto: the one transformers picks for the model, SDPA "
    "where it supports it, else eager)",
    AUTO_ATTN,
    choices=lambda: ATTN_CHOICES,
    convert=one_of(ATTN_CHOICES),
)
BACKEND_OPTION = Option(
    "backend-option",
    "backend-specific setting, repeatable",
    None,
    "KEY=VALUE",
    multiple=True,
    default_help="the backend's own",
    convert=key_values("backend option"),
)
CALL_TIMEOUT = Option(
    "call-timeout",
    "seconds one engine or backend call may take; a call that overruns ends the run "
    "incomplete as hung",
    "600",
    "S",
    convert=positive_number,
)

START_TIMEOUT = Option(
    "start-timeout",
    "seconds an engine or backend may take to start; past them the run ends incomplete",
    "900",
    "S",
    convert=positive_number,
)

#: the options a run is judged at: what the suites draw and the bounds they are held to, not the
#: stack that starts. ``tim-conformance check`` holds the values a launch names of them to the
#: certificate's: it covers a launch at the values it was certified at, not at others
JUDGED_OPTIONS = (PROFILE, EXAMPLES, DEPTH, *RUN_SHAPE_OPTIONS, SHRINK_SECONDS)

STACK_OPTIONS = (
    ENGINE,
    BACKEND,
    MODEL,
    ENGINE_DTYPE,
    BACKEND_DTYPE,
    PROFILE,
    EXAMPLES,
    DEPTH,
    *RUN_SHAPE_OPTIONS,
    SHRINK_SECONDS,
    LOGPROBS,
    ENGINE_OPTION,
    ENGINE_URL,
    BACKEND_MICRO_BATCH,
    BACKEND_ATTN,
    BACKEND_OPTION,
    CALL_TIMEOUT,
    START_TIMEOUT,
)


def add_stack_options(addoption: Callable[..., object], *, prefix: str) -> None:
    """Register every stack option on a pytest group or an argparse parser.

    Defaults are left to :func:`resolve` so that ini files and pyproject can fill the gaps.
    """
    for option in STACK_OPTIONS:
        addoption(
            f"--{prefix}{option.name}",
            dest=option.dest,
            action="append" if option.multiple else "store",
            default=None,
            metavar=option.metavar,
            help=option.help_text(),
        )


def pyproject_table(rootdir: Path) -> dict[str, Any]:
    """``[tool.tim-conformance]`` of ``rootdir/pyproject.toml``, or ``{}``."""
    path = rootdir / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text()).get("tool", {}).get("tim-conformance", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML ({exc})", "fix the file") from exc
    return table


def stack_given(given: Mapping[str, Any]) -> bool:
    """Whether ``given`` (keyed by ``Option.dest``) names any stack option."""
    return any(given.get(o.dest) not in (None, []) for o in STACK_OPTIONS)


def resolve(given: Mapping[str, Any], *fallbacks: Mapping[str, Any]) -> dict[str, Any]:
    """Each option's typed value, from the command line first, then each fallback table, then
    the default; a value no converter takes is one UsageError line.

    ``given`` is keyed by ``Option.dest``; fallbacks are keyed by ``Option.name`` (with ``-`` or
    ``_``), as in ini files, pyproject tables and a certificate's ``spec``. The model is
    converted last: naming an embedded one builds it on first use, which a bad value of
    another option should not cost.
    """
    chosen: dict[Option, Any] = {}
    for option in STACK_OPTIONS:
        value = _given_value(option, given, fallbacks)
        if value is None:
            value = option.default
        if option.multiple:
            value = [value] if isinstance(value, str) else list(value or [])
        chosen[option] = value
    typed = {o: o.typed(chosen[o]) for o in sorted(STACK_OPTIONS, key=lambda o: o is MODEL)}
    return {option.name: typed[option] for option in STACK_OPTIONS}


def named(given: Mapping[str, Any], *fallbacks: Mapping[str, Any]) -> frozenset[str]:
    """The names of the stack options given a value (as :func:`resolve` reads ``given`` and
    the fallbacks), where no default filled it."""
    return frozenset(o.name for o in STACK_OPTIONS if _given_value(o, given, fallbacks) is not None)


def _given_value(
    option: Option, given: Mapping[str, Any], fallbacks: tuple[Mapping[str, Any], ...]
) -> Any:
    """``option``'s value from the command line first, then each fallback table; None where
    none gives one."""
    value = given.get(option.dest)
    for table in fallbacks:
        if value not in (None, [], ""):
            break
        value = table.get(option.name, table.get(option.name.replace("-", "_")))
    return None if value in (None, [], "") else value


def flags(values: Mapping[str, str | list[str] | None], *, prefix: str) -> list[str]:
    """The ``--PREFIXNAME VALUE`` flags of option values as the command line spells them
    (:meth:`conformance.stack.StackSpec.option_values`), for people and records. Options at
    their default are left out but the ones that name the stack."""
    args = []
    for option in STACK_OPTIONS:
        value = values.get(option.name)
        for one in value if isinstance(value, list) else [value]:
            if one is not None and (option.name in _NAMED or one != option.default):
                args += [f"--{prefix}{option.name}", one]
    return args


#: the options every rendering of a stack names, default or not
_NAMED = frozenset({"engine", "backend", "engine-dtype", "backend-dtype", "profile", "examples"})


def check_output_folder(path: Path, flag: str = "--out") -> None:
    """Refuse, before anything runs, a folder ``flag`` names that cannot be written: an existing
    file, a path under a file, or one whose nearest existing folder takes no new entry (a
    read-only mount, /proc, permissions). That is tried, not asked of ``os.access`` (which says
    yes to root on permissions, and knows nothing of /proc): a probe folder made there and
    removed at once, so nothing is left behind, ``path`` itself not created."""
    fix = f"pass {flag} a new or existing folder you can write"
    existing = path
    try:
        while not existing.exists():
            existing = existing.parent
        is_dir = existing.is_dir()
    except OSError as exc:
        raise UsageError(f"{flag} {path} cannot be looked up ({exc.strerror})", fix) from None
    if not is_dir:
        where = "is a file" if existing == path else f"is under {existing}, a file"
        raise UsageError(f"{flag} {path} {where}, not a folder", fix)
    try:
        tempfile.TemporaryDirectory(dir=existing, prefix=".tim-write-probe-").cleanup()
    except OSError as exc:
        raise UsageError(
            f"{flag} {path} cannot be written: {existing} takes no new folder ({exc.strerror})",
            fix,
        ) from None
