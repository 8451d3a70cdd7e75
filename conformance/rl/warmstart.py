"""A short supervised warm start on the task, through the backend's own recompute.

RL from a random tiny model finds no reward to learn from; a few dozen teacher-forced steps make
the policy partly right, which is where GRPO has signal (reward spread within groups).
"""

from __future__ import annotations

import random

import torch

from conformance.backends.base import Backend
from conformance.rl.task import CountingTask

WARM_BATCH = 32


def response_slice(logprobs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The per-position entries (log-probs, entropies) of the response: ``prompt_len − 1`` on."""
    return logprobs[prompt_len - 1 :]


def warm_start(
    backend: Backend, task: CountingTask, *, steps: int, lr: float, rng: random.Random
) -> list[float]:
    """Minimise the mean response NLL for ``steps`` Adam steps; return the loss of each step."""
    module = backend.module
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        problems = task.problems(WARM_BATCH, rng)
        out = backend.recompute([p.prompt + p.target for p in problems], grad=True)
        nll = torch.cat(
            [
                -response_slice(lp, len(p.prompt))
                for lp, p in zip(out.logprobs, problems, strict=True)
            ]
        ).mean()
        optimizer.zero_grad()
        nll.backward()
        optimizer.step()
        losses.append(float(nll.detach()))
    return losses
