"""The RL training options, defined once for every entry point.

``rl-smoke`` and ``certify --rl-smoke`` spell them ``--NAME``, pytest ``--tim-NAME`` (certify
hands them to its pytest run that way). Cheap to import (the pytest plugin loads it): no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conformance.options import dest

#: where the importance ratio's denominator comes from: the trainer's recompute at the rollout
#: weights (verl's default) or the engine's own log-probs (verl's bypass mode, decoupled PPO)
OLD_LOGPROBS = ("recompute", "engine")
#: one update per rollout batch: the ratio starts at 1 and token clipping only acts off-policy
UPDATES_PER_STEP = 1


@dataclass(frozen=True)
class TrainingOption:
    name: str
    help: str
    type: Callable[[str], Any]
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return dest(self.name)

    @property
    def field(self) -> str:
        """The ``RunConfig`` field it sets."""
        return self.name.replace("-", "_")


TRAINING_OPTIONS = (
    TrainingOption(
        "updates-per-step",
        f"optimizer updates per rollout batch, each on the next 1/K of it (default: "
        f"{UPDATES_PER_STEP}); K > 1 is the seeds' off-policy setting",
        int,
        metavar="K",
    ),
    TrainingOption(
        "old-logprobs",
        "old policy in the importance ratio: the trainer's recompute or the engine's "
        "log-probs (default: recompute)",
        str,
        choices=OLD_LOGPROBS,
    ),
    TrainingOption(
        "clip-low",
        "ratio clip range below 1, ε_low (default: 0.2; 3e-4 with --remedy gspo)",
        float,
        metavar="EPS",
    ),
    TrainingOption(
        "clip-high",
        "ratio clip range above 1, ε_high: DAPO's decoupled clip (default: 0.2; 4e-4 with "
        "--remedy gspo)",
        float,
        metavar="EPS",
    ),
)


def add_training_options(addoption: Callable[..., Any], *, prefix: str) -> None:
    """Register the training options on an argparse parser or a pytest option group."""
    for option in TRAINING_OPTIONS:
        kwargs: dict[str, Any] = {"dest": option.dest, "default": None, "help": option.help}
        if option.choices:
            kwargs["choices"] = option.choices
        else:
            kwargs["metavar"] = option.metavar
        addoption(f"--{prefix}{option.name}", type=option.type, **kwargs)


def training_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``RunConfig`` keyword arguments from parsed options (keyed by ``dest``), given ones only."""
    return {o.field: values[o.dest] for o in TRAINING_OPTIONS if values.get(o.dest) is not None}


def pytest_args(values: Mapping[str, Any]) -> list[str]:
    """The ``--tim-NAME VALUE`` flags that hand the given options on to a pytest run."""
    args = []
    for option in TRAINING_OPTIONS:
        if values.get(option.dest) is not None:
            args += [f"--tim-{option.name}", str(values[option.dest])]
    return args
