"""The stack options, defined once: pytest spells them ``--tim-NAME`` (ini key ``tim_NAME``, or
``NAME`` under ``[tool.tim-conformance]`` in pyproject.toml); the CLI spells them ``--NAME``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.depth import DEPTHS
from conformance.errors import UsageError


def dest(name: str) -> str:
    """Where a parsed option ``--NAME`` / ``--tim-NAME`` lands (argparse's ``dest``, pytest's
    option name), which is also its ini key: ``tim_`` and the name in snake case."""
    return "tim_" + name.replace("-", "_")


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    default: str | None = None
    metavar: str = "VALUE"
    multiple: bool = False

    @property
    def dest(self) -> str:
        return dest(self.name)


ENGINE = Option("engine", "inference engine under test (default: hf-generate)", "hf-generate", "E")
BACKEND = Option("backend", "training backend that recomputes logprobs (default: hf)", "hf", "B")
MODEL = Option(
    "model", "model folder, or embedded:moe (default: the embedded tiny model)", None, "DIR"
)
ENGINE_DTYPE = Option("engine-dtype", "engine precision (default: float32)", "float32", "D")
BACKEND_DTYPE = Option("backend-dtype", "backend precision (default: float32)", "float32", "D")
PROFILE = Option(
    "profile",
    "tolerance profile name or TOML path (default: implied by the dtypes; on a model or device "
    "the shipped ones were not calibrated on, the model's own, calibrated first and cached)",
    None,
    "P",
)
EXAMPLES = Option("examples", "Hypothesis examples per property (default: 20)", "20", "N")
DEPTH = Option(
    "depth",
    "how far the property search reaches: "
    + "; ".join(d.describe() for d in DEPTHS.values())
    + " (default: quick)",
    "quick",
    "NAME",
)
MAX_PROMPT_LEN = Option(
    "max-prompt-len",
    "the run's longest prompt: overrides the depth's (every property reaches it once)",
    None,
    "N",
)
MAX_NEW_TOKENS = Option(
    "max-new-tokens",
    "the run's longest rollout: overrides the depth's (every property reaches it once)",
    None,
    "N",
)
MAX_BATCH = Option(
    "max-batch", "the run's rollout batch (sequences): overrides the depth's", None, "N"
)
GROUP_SIZE = Option(
    "group-size",
    "the run's GRPO group size (samples per prompt): grouped batches reach it",
    None,
    "N",
)
MAX_BATCH_TOKENS = Option(
    "max-batch-tokens",
    "tokens one drawn batch holds, sequences x (longest prompt + new tokens): overrides the "
    "depth's, and on a CPU the smaller budget a costly model gets",
    None,
    "N",
)
#: the options that give a run's own shape in place of the depth's limits
RUN_SHAPE_OPTIONS = (MAX_PROMPT_LEN, MAX_NEW_TOKENS, MAX_BATCH, GROUP_SIZE, MAX_BATCH_TOKENS)
SHRINK_SECONDS = Option(
    "shrink-seconds",
    "seconds Hypothesis may spend shrinking a failure to a minimal case; past them the report "
    "says the case was not fully shrunk (default: 60)",
    "60",
    "S",
)
LOGPROBS = Option(
    "logprobs", "which logprobs the engine is asked for: raw or processed (default: raw)", "raw"
)
ENGINE_OPTION = Option(
    "engine-option", "engine-specific setting, repeatable", None, "KEY=VALUE", multiple=True
)
ENGINE_URL = Option("engine-url", "attach to an engine server already running there", None, "URL")
BACKEND_MICRO_BATCH = Option(
    "backend-micro-batch", "backend micro-batch size (default: 8)", "8", "N"
)
BACKEND_ATTN = Option(
    "backend-attn", "backend attention implementation: sdpa or eager (default: sdpa)", "sdpa"
)
BACKEND_OPTION = Option(
    "backend-option", "backend-specific setting, repeatable", None, "KEY=VALUE", multiple=True
)
CALL_TIMEOUT = Option(
    "call-timeout",
    "seconds one engine or backend call may take; a call that overruns ends the run "
    "incomplete as hung (default: 600)",
    "600",
    "S",
)

START_TIMEOUT = Option(
    "start-timeout",
    "seconds an engine or backend may take to start; past them the run ends incomplete "
    "(default: 900)",
    "900",
    "S",
)

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


def add_stack_options(addoption: Callable[..., Any], *, prefix: str) -> None:
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
            help=option.help,
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


def resolve(
    given: Mapping[str, Any], *fallbacks: Mapping[str, Any]
) -> dict[str, str | list[str] | None]:
    """Each option's value: the command line first, then each fallback table, then the default.

    ``given`` is keyed by ``Option.dest``; fallbacks are keyed by ``Option.name`` (with ``-`` or
    ``_``), as in ini files and pyproject tables.
    """
    values: dict[str, str | list[str] | None] = {}
    for option in STACK_OPTIONS:
        value = given.get(option.dest)
        for table in fallbacks:
            if value not in (None, [], ""):
                break
            value = table.get(option.name, table.get(option.name.replace("-", "_")))
        if value in (None, [], ""):
            value = option.default
        if option.multiple:
            value = [value] if isinstance(value, str) else list(value or [])
        values[option.name] = value
    return values


def parse_key_values(pairs: list[str], *, what: str = "engine option") -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``."""
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {pair!r} is not KEY=VALUE", "write e.g. max_num_seqs=4")
        parsed[key.strip()] = value.strip()
    return parsed
