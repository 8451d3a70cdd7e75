"""Scenarios: what a smoke run does to the stack, and from which step (``--at``, ``--strength``).

- ``exact``: the rollout log-probs are replaced by the trainer's own recompute, so ρ ≡ 1 bitwise
  (VeXact's zero-mismatch control).
- ``natural``: the stack's own mismatch, as the engine reports it.
- ``biased``: token weights φ = δ on tokens with π_train < 0.1 (objective-level-hacking Eq. 18).
- ``unbiased``: token weights ξ ~ N(1, σ²) (Eq. 21).
- ``engine-bias``: a biased engine — it reports ``π_infer / δ`` for the tokens it gives
  ``π_infer < π_low = 0.1`` (sampling unchanged), the shape of the bias objective-level-hacking
  Fig. 7 measures on real engines (ρ drifting from 1 in the low-probability bins), at a size of
  our choosing. With the engine's log-probs as the old policy (``--old-logprobs engine``) the
  ratio of those tokens is scaled by δ: the mismatch itself becomes Eq. 18's distortion.
- ``inject``: the engine gets ``θ + s · rms(θ) · ε`` (fresh ε every step) instead of θ — a real
  rollout-side mismatch of known size, in both the sampling distribution and its log-probs,
  switched on at ``at`` and ramped over ``ramp`` steps (VeXact's re-introduced mismatch).
- ``lr-jump``: the learning rate is multiplied by ``strength`` from ``at`` on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from conformance.errors import UsageError
from conformance.rl import grpo

#: scenario → default strength (δ, σ, weight-noise scale, LR factor)
DEFAULT_STRENGTH = {
    "exact": 0.0,
    "natural": 0.0,
    "biased": 2.0,
    "unbiased": 0.2,
    "engine-bias": 2.0,
    "inject": 0.05,
    "lr-jump": 100.0,
}
SCENARIOS = tuple(DEFAULT_STRENGTH)


@dataclass(frozen=True)
class Scenario:
    name: str
    at: int = 0
    strength: float | None = None
    ramp: int = 1

    def __post_init__(self) -> None:
        if self.name not in DEFAULT_STRENGTH:
            raise UsageError(
                f"unknown scenario {self.name!r}", f"choose one of: {', '.join(SCENARIOS)}"
            )
        if self.at < 0 or self.ramp < 1:
            raise UsageError(f"--at {self.at} / ramp {self.ramp}", "use --at >= 0 and ramp >= 1")
        if self.strength is not None and self.strength < 0:
            raise UsageError(f"--strength {self.strength}", "use a strength >= 0")

    @property
    def size(self) -> float:
        return DEFAULT_STRENGTH[self.name] if self.strength is None else self.strength

    def level(self, step: int) -> float:
        """How much is injected: 0 before ``at`` (and always for ``exact`` and ``natural``),
        then rising linearly to 1 over ``ramp`` steps."""
        if step < self.at or self.name in ("exact", "natural"):
            return 0.0
        return min(1.0, (step - self.at + 1) / self.ramp)

    def rollout_logprobs(
        self, step: int, lp_infer: torch.Tensor, lp_old: torch.Tensor
    ) -> torch.Tensor:
        """What the update sees as the engine's log-probs: the trainer's own under ``exact``;
        ``log(π_infer / δ)`` on the engine's low-probability tokens under ``engine-bias``."""
        if self.name == "exact":
            return lp_old
        if self.name == "engine-bias" and self.level(step) > 0:
            low = lp_infer < math.log(grpo.P_LOW)
            return torch.where(low, lp_infer - math.log(self.size), lp_infer)
        return lp_infer

    def token_weights(
        self, step: int, p_old: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor | None:
        """The injected objective distortion of ``biased`` / ``unbiased``, or ``None``."""
        if self.level(step) == 0.0:
            return None
        if self.name == "biased":
            return grpo.biased_weights(p_old, self.size)
        if self.name == "unbiased":
            return grpo.unbiased_weights(p_old.shape, self.size, generator)
        return None

    def lr_factor(self, step: int) -> float:
        return self.size if self.name == "lr-jump" and self.level(step) > 0 else 1.0

    def engine_weights(
        self, step: int, state: Mapping[str, torch.Tensor], generator: torch.Generator
    ) -> Mapping[str, torch.Tensor]:
        """The weights the engine gets after ``step``'s update (perturbed under ``inject``)."""
        scale = self.size * self.level(step + 1) if self.name == "inject" else 0.0
        if scale == 0.0:
            return state
        return {name: perturbed(t, scale, generator) for name, t in state.items()}


def perturbed(tensor: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """``t + scale · rms(t) · ε``, ε ~ N(0, 1); non-float tensors (buffers of ids) unchanged."""
    if not tensor.is_floating_point():
        return tensor
    t = tensor.detach().float()
    noise = torch.randn(t.shape, generator=generator, dtype=torch.float32)
    rms = t.pow(2).mean().sqrt()
    return (t + scale * rms * noise).to(tensor.dtype)
