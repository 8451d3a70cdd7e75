"""GRPO math and the mismatch remedies, as pure functions over padded ``[B, T]`` tensors.

``mask`` marks the valid (response) tokens. Log-probabilities: ``lp`` is the trainer's current
(with grad), ``lp_old`` the old policy of the ratio (detached: the trainer's recompute at the
rollout weights, or the engine's own log-probs), ``lp_infer`` the engine's.
``ρ = π_train(θ_old) / π_infer(θ_old) = exp(lp_recompute − lp_infer)``.
"""

from __future__ import annotations

import torch

from conformance.errors import UsageError

# the clipped surrogates are the loss every backend trains with: they live with it, in the core
from conformance.training import (  # noqa: F401 — GRPO math, as the RL code and its tests name it
    CLIP_EPS,
    GSPO_EPS,
    Surrogate,
    clipped_surrogate,
    gspo_surrogate,
)

#: TIS cap C (Yao et al. 2025; verl ``tis_imp_ratio_cap``)
TIS_CAP = 2.0
#: MIS cap C: tokens with ρ > C are dropped
MIS_CAP = 2.0
#: IcePop band [α, β] (verl)
ICEPOP_BAND = (0.5, 5.0)
#: sequence-level MIS cap (TRL ``sequence_mask``, clip 3.0)
SEQ_MIS_CAP = 3.0
#: low-probability threshold π_low of Eq. 18 and the δ the paper fixes when monitoring J (Eq. 23)
P_LOW = 0.1
J_DELTA = 2.0

REMEDIES = ("none", "tis", "mis", "icepop", "seq-mis", "gspo", "lr-decay", "lr-low")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantage ``Â_i = (R_i − mean(R)) / (std(R) + eps)`` per group.

    ``rewards``: ``[groups, G]``; returns the same shape (objective-level-hacking Eq. 3). A group
    whose rewards are all equal gets zero advantage. ``std`` is the sample std (as TRL/verl).
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise UsageError(f"rewards of shape {tuple(rewards.shape)}", "pass [groups, G >= 2]")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def rho(lp_old: torch.Tensor, lp_infer: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``ρ = exp(lp_old − lp_infer)`` at valid tokens, 1 elsewhere (masked slots never NaN)."""
    diff = torch.where(mask, lp_old - lp_infer, torch.zeros_like(lp_old))
    return torch.exp(diff)


def tis_weights(rho_: torch.Tensor, cap: float = TIS_CAP) -> torch.Tensor:
    """Truncated IS: ``w = min(ρ, C)`` (Yao et al. 2025)."""
    return torch.clamp(rho_, max=cap)


def masked_weights(rho_: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``w = ρ · 1[low ≤ ρ ≤ high]``: MIS with ``[0, C]``, IcePop with ``[0.5, 5]``."""
    keep = (rho_ >= low) & (rho_ <= high)
    return rho_ * keep


def sequence_masked_weights(
    rho_: torch.Tensor, mask: torch.Tensor, cap: float = SEQ_MIS_CAP
) -> torch.Tensor:
    """Sequence-level MIS: ``w_{i,t} = ρ_i · 1[ρ_i ≤ C]``, ``ρ_i = Π_t ρ_{i,t}`` (TRL)."""
    log_seq = (torch.log(rho_) * mask).sum(dim=1, keepdim=True)
    seq = torch.exp(log_seq)
    return (seq * (seq <= cap)).expand_as(rho_)


def remedy_weights(
    remedy: str, lp_old: torch.Tensor, lp_infer: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor | None:
    """Per-token IS weights for a token-level remedy; ``None`` for the others."""
    rho_ = rho(lp_old, lp_infer, mask)
    if remedy == "tis":
        return tis_weights(rho_)
    if remedy == "mis":
        return masked_weights(rho_, 0.0, MIS_CAP)
    if remedy == "icepop":
        return masked_weights(rho_, *ICEPOP_BAND)
    if remedy == "seq-mis":
        return sequence_masked_weights(rho_, mask)
    return None


def biased_weights(p_old: torch.Tensor, delta: float, p_low: float = P_LOW) -> torch.Tensor:
    """Eq. 18: ``φ = δ`` on tokens with ``π_train(θ_old) < π_low``, else 1."""
    return torch.where(p_old < p_low, torch.full_like(p_old, delta), torch.ones_like(p_old))


def unbiased_weights(shape: torch.Size, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Eq. 21: ``ξ ~ N(1, σ²)`` independently per token."""
    return 1 + sigma * torch.randn(shape, generator=generator, dtype=torch.float32)


def hacking_signal(
    advantages: torch.Tensor,
    p_old: torch.Tensor,
    mask: torch.Tensor,
    delta: float = J_DELTA,
    p_low: float = P_LOW,
) -> float:
    """Objective-level-hacking monitor ``J = Σ_{i,t} Â_{i,t} (φ_{i,t} − 1)`` (Eq. 23, δ = 2)."""
    phi = biased_weights(p_old, delta, p_low)
    return float((advantages.unsqueeze(1) * (phi - 1) * mask).sum())
