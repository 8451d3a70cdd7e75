"""GRPO math and the mismatch remedies, as pure functions over padded ``[B, T]`` tensors.

``mask`` marks the valid (response) tokens. Log-probabilities: ``lp`` is the trainer's current
(with grad), ``lp_old`` the old policy of the ratio (detached: the trainer's recompute at the
rollout weights, or the engine's own log-probs), ``lp_infer`` the engine's.
``ρ = π_train(θ_old) / π_infer(θ_old) = exp(lp_recompute − lp_infer)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance.errors import UsageError

#: PPO/GRPO clip range, both sides (objective-level-hacking Eq. 2 and §4.1)
CLIP_EPS = 0.2
#: GSPO's sequence-level clip range (Zheng et al. 2025, GSPO §5; objective-level-hacking §4.1:
#: 3e-4 left, 4e-4 right)
GSPO_EPS = (3e-4, 4e-4)
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


@dataclass
class Surrogate:
    """A clipped surrogate evaluated on a batch: the objective and where the clip acted."""

    #: ``[B]``: each sequence's objective term (to maximise); the GRPO objective is their mean
    per_sequence: torch.Tensor
    #: ``[B, T]``: valid tokens whose gradient the lower clip cut (ratio < 1 − ε_low, Â < 0)
    clipped_low: torch.Tensor
    #: ``[B, T]``: valid tokens whose gradient the upper clip cut (ratio > 1 + ε_high, Â > 0)
    clipped_high: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        """The negated objective of Eq. 2, ``−(1/G) Σ_i per_sequence[i]``."""
        return -self.per_sequence.mean()


def clipped_surrogate(
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    eps: tuple[float, float] = (CLIP_EPS, CLIP_EPS),
) -> Surrogate:
    """Token-level clipped surrogate with decoupled clip ranges and optional token weights ``w``.

    ``per_sequence[i] = (1/|o_i|) Σ_t w_{i,t} · min(r A_i, clip(r, 1 − ε_low, 1 + ε_high) A_i)``,
    ``r = exp(lp − lp_old)`` (objective-level-hacking Eq. 2, 17; DAPO's decoupled clip,
    Yu et al. 2025, with ``eps = (ε_low, ε_high)``). The clip acts — the token's gradient is
    zero — where ``r < 1 − ε_low`` with ``Â < 0`` or ``r > 1 + ε_high`` with ``Â > 0`` (verl's
    ``pg_clipfrac``).
    """
    ratio = torch.exp(torch.where(mask, lp - lp_old, torch.zeros_like(lp)))
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - eps[0], 1 + eps[1])
    objective = torch.minimum(ratio * adv, clipped * adv)
    if weights is not None:
        objective = objective * weights
    per_sequence = (objective * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return Surrogate(
        per_sequence=per_sequence,
        clipped_low=(ratio < 1 - eps[0]) & (adv < 0) & mask,
        clipped_high=(ratio > 1 + eps[1]) & (adv > 0) & mask,
    )


def gspo_surrogate(
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps: tuple[float, float] = GSPO_EPS,
    weights: torch.Tensor | None = None,
) -> Surrogate:
    """GSPO-token: one clipped ratio per sequence, ``s_i = exp((1/|o_i|) Σ_t (lp − lp_old))``.

    ``per_sequence[i] = (1/|o_i|) Σ_t w_{i,t} min(s_{i,t} A_i, clip(s_{i,t}, 1 − ε_low,
    1 + ε_high) A_i)`` with ``s_{i,t} = sg[s_i] · π(o_t) / sg[π(o_t)]`` (Zheng et al. 2025,
    Eq. 5–7 and GSPO-token Eq. 13; objective-level-hacking Eq. 16, 19). Its value is
    ``s_i``'s and, without weights, its gradient is GSPO's; ``w`` weights each token's term (the
    injected distortions of Eq. 19–21). A clipped sequence has all its tokens cut.
    """
    lengths = mask.sum(dim=1).clamp(min=1)
    diff = torch.where(mask, lp - lp_old, torch.zeros_like(lp))
    seq_ratio = torch.exp(diff.detach().sum(dim=1) / lengths)
    lp_valid = torch.where(mask, lp, torch.zeros_like(lp))
    token_ratio = seq_ratio.unsqueeze(1) * torch.exp(lp_valid - lp_valid.detach())
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(token_ratio, 1 - eps[0], 1 + eps[1])
    objective = torch.minimum(token_ratio * adv, clipped * adv)
    if weights is not None:
        objective = objective * weights
    low = ((seq_ratio < 1 - eps[0]) & (advantages < 0)).unsqueeze(1)
    high = ((seq_ratio > 1 + eps[1]) & (advantages > 0)).unsqueeze(1)
    return Surrogate(
        per_sequence=(objective * mask).sum(dim=1) / lengths,
        clipped_low=low & mask,
        clipped_high=high & mask,
    )


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
