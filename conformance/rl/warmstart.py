"""A short supervised warm start on the task, through the backend's training protocol.

RL from a random tiny model finds no reward to learn from; a few dozen teacher-forced steps make
the policy partly right, which is where GRPO has signal (reward spread within groups).
"""

from __future__ import annotations

import random

from conformance.backends.base import Backend
from conformance.rl.task import CountingTask
from conformance.training import Objective, PolicyBatch

WARM_BATCH = 32


def warm_start(
    backend: Backend, task: CountingTask, *, steps: int, lr: float, rng: random.Random
) -> list[float]:
    """Minimise the mean response NLL for ``steps`` Adam steps (no gradient clip) through
    ``Backend.update``, then reset the optimizer for RL; return the loss of each step."""
    losses = []
    for _ in range(steps):
        problems = task.problems(WARM_BATCH, rng)
        batch = PolicyBatch(
            sequences=tuple(tuple(p.prompt + p.target) for p in problems),
            prompt_lengths=tuple(len(p.prompt) for p in problems),
            objective=Objective("nll"),
            lr=lr,
            max_grad_norm=None,
        )
        losses.append(backend.update(batch)["loss"])
    backend.reset_optimizer()
    return losses
