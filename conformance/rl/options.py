"""The RL training options, defined once for every entry point.

``rl-smoke`` and ``certify --rl-smoke`` spell them ``--NAME``, pytest ``--tim-NAME`` (certify
hands them to its pytest run that way). Cheap to import (the pytest plugin loads it): no torch.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conformance.errors import UsageError
from conformance.options import dest

#: where the importance ratio's denominator comes from: the trainer's recompute at the rollout
#: weights (verl's default) or the engine's own log-probs (verl's bypass mode, decoupled PPO)
OLD_LOGPROBS = ("recompute", "engine")
#: one update per rollout batch: the ratio starts at 1 and token clipping only acts off-policy
UPDATES_PER_STEP = 1


def _number_in(low: float, high: float | None) -> Callable[[str], float]:
    """A converter to a number in ``[low, high)`` (no upper end where ``high`` is None),
    refusing in argparse's way: one line naming the range."""
    span = f"[{low:g}, {'inf' if high is None else f'{high:g}'})"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= low and (high is None or value < high)):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number in {span}")
        return value

    return convert


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


@dataclass(frozen=True)
class TrainingOption:
    name: str
    help: str
    type: Callable[[str], Any]
    #: the default in words (the objective's, where the option is not given)
    default: str
    #: the default under ``--remedy gspo``, which ``rl-smoke`` takes and certify does not
    gspo_default: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return dest(self.name)

    @property
    def field(self) -> str:
        """The ``RunConfig`` field it sets."""
        return self.name.replace("-", "_")

    def help_text(self, *, remedy: bool) -> str:
        """``help`` and its default; with ``remedy`` (a parser that takes ``--remedy``) its
        default under GSPO too."""
        gspo = f"; {self.gspo_default} with --remedy gspo" if remedy and self.gspo_default else ""
        return f"{self.help} (default: {self.default}{gspo})"


TRAINING_OPTIONS = (
    TrainingOption(
        "updates-per-step",
        "optimizer updates per rollout batch, each on the next 1/K of it; K > 1 is the seeds' "
        "off-policy setting",
        _positive_int,
        str(UPDATES_PER_STEP),
        metavar="K",
    ),
    TrainingOption(
        "old-logprobs",
        "old policy in the importance ratio: the trainer's recompute or the engine's log-probs",
        str,
        OLD_LOGPROBS[0],
        choices=OLD_LOGPROBS,
    ),
    TrainingOption(
        "clip-low",
        "ratio clip range below 1, ε_low: the ratio is clipped at 1 − ε_low",
        _number_in(0.0, 1.0),
        "0.2",
        gspo_default="3e-4",
        metavar="EPS",
    ),
    TrainingOption(
        "clip-high",
        "ratio clip range above 1, ε_high: DAPO's decoupled clip",
        _number_in(0.0, None),
        "0.2",
        gspo_default="4e-4",
        metavar="EPS",
    ),
)


def add_training_options(
    addoption: Callable[..., Any], *, prefix: str, remedy: bool = False
) -> None:
    """Register the training options on an argparse parser or a pytest option group;
    ``remedy``: the parser takes ``--remedy`` too (its help names the defaults under it)."""
    for option in TRAINING_OPTIONS:
        kwargs: dict[str, Any] = {
            "dest": option.dest,
            "default": None,
            "help": option.help_text(remedy=remedy),
        }
        if option.choices:
            kwargs["choices"] = option.choices
        else:
            kwargs["metavar"] = option.metavar
        addoption(f"--{prefix}{option.name}", type=option.type, **kwargs)


def training_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``RunConfig`` keyword arguments from parsed options (keyed by ``dest``), given ones only."""
    return {o.field: values[o.dest] for o in TRAINING_OPTIONS if values.get(o.dest) is not None}


def rl_smoke_args(values: Mapping[str, Any], *, rl_smoke: bool) -> list[str]:
    """The pytest flags that add the RL smoke run, with the given training options, to a
    certify run (none without ``rl_smoke``); training options without it are one UsageError
    line."""
    if not rl_smoke:
        if training_values(values):
            raise UsageError(
                "RL training options without --rl-smoke", "add --rl-smoke or drop them"
            )
        return []
    return ["--tim-rl-smoke", *pytest_args(values)]


def pytest_args(values: Mapping[str, Any]) -> list[str]:
    """The ``--tim-NAME VALUE`` flags that hand the given options on to a pytest run."""
    args = []
    for option in TRAINING_OPTIONS:
        if values.get(option.dest) is not None:
            args += [f"--tim-{option.name}", str(values[option.dest])]
    return args
