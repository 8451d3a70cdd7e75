"""What one training step minimises: the batch a backend trains on, its loss and the clipped
surrogates it is built from, as pure functions (the core: backends and the RL loop import it).

``Backend.update(batch)`` (``conformance.backends.base``) computes the response log-probabilities
of ``batch.sequences`` with grad at its current weights, calls :func:`policy_loss` on them and
takes one optimizer step. Every backend calls this very function — the ``fsdp`` backend inside
its worker processes, which is why this module imports nothing but torch — so one update means
the same thing on every stack.

Alignment: a batch holds ``B`` sequences ``s_i`` (prompt then response) and their prompt lengths
``p_i``; response token ``j`` of sequence ``i`` is ``s_i[p_i + j]``, ``j < n_i = len(s_i) − p_i``.
Every per-token tensor is ``[B, T]`` with ``T = max_i n_i``: column ``j`` of row ``i`` belongs to
``s_i[p_i + j]``, and columns ``j ≥ n_i`` are padding (0, never read). In a backend's
``recompute`` output (entry ``t`` scores ``s[t + 1]``) response token ``j`` is entry
``p_i − 1 + j`` (:func:`response_logprobs`).

Normalisation: the loss is a *sum* over the batch's sequences (tokens, for ``nll``) divided by
``batch.loss_norm``, fixed when the full batch is built. A shard of the batch
(:meth:`PolicyBatch.shard`) keeps that norm, so the shards' losses (and gradients, and counts)
add up to the full batch's: data-parallel ranks or gradient-accumulation micro-batches each
call :func:`policy_loss` on their shard and sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch.nn.utils.rnn import pad_sequence

from conformance.errors import UsageError
from conformance.routing import Routes

#: PPO/GRPO clip range, both sides (objective-level-hacking Eq. 2 and §4.1)
CLIP_EPS = 0.2
#: GSPO's sequence-level clip range (Zheng et al. 2025, GSPO §5; objective-level-hacking §4.1:
#: 3e-4 left, 4e-4 right)
GSPO_EPS = (3e-4, 4e-4)
#: gradient-norm clip (verl's default ``grad_clip``); the reported norm is the one before it
MAX_GRAD_NORM = 1.0
#: the optimizer every backend uses for ``update``: torch Adam with its defaults but the LR
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8

#: ``token-clip``: GRPO/PPO/DAPO token-level clipped surrogate; ``seq-clip``: GSPO's
#: sequence-level clip; ``nll``: mean negative log-likelihood of the responses (warm start)
OBJECTIVES = ("token-clip", "seq-clip", "nll")
#: the clip ranges each objective uses unless told otherwise
DEFAULT_CLIP = {
    "token-clip": (CLIP_EPS, CLIP_EPS),
    "seq-clip": GSPO_EPS,
    "nll": (0.0, 0.0),
}
#: the additive counts :func:`policy_loss` reports (sum them over shards and updates)
COUNTS = ("tokens", "sequences", "clip_low", "clip_high", "clip_seq", "ratio_k3")


@dataclass(frozen=True)
class Objective:
    """The loss spec: which objective, and its clip range ``[1 − clip_low, 1 + clip_high]``."""

    kind: str = "token-clip"
    clip_low: float | None = None
    clip_high: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise UsageError(
                f"unknown objective {self.kind!r}", f"choose one of: {', '.join(OBJECTIVES)}"
            )
        if not 0 <= self.eps[0] < 1 or self.eps[1] < 0:
            raise UsageError(
                f"clip range low {self.eps[0]:g} / high {self.eps[1]:g}",
                "use 0 <= --clip-low < 1 and --clip-high >= 0",
            )

    @property
    def eps(self) -> tuple[float, float]:
        """``(ε_low, ε_high)``, the objective's defaults where not given."""
        low, high = DEFAULT_CLIP[self.kind]
        return (
            low if self.clip_low is None else self.clip_low,
            high if self.clip_high is None else self.clip_high,
        )


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


def adam_at(
    optimizer: torch.optim.Optimizer | None, params: Sequence[torch.nn.Parameter], lr: float
) -> torch.optim.Optimizer:
    """The trainer's Adam over ``params`` (made on first use: ``ADAM_BETAS``, ``ADAM_EPS``, no
    weight decay), its learning rate set to this step's ``lr`` (schedules change it per step)."""
    if optimizer is None:
        optimizer = torch.optim.Adam(params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return optimizer


def response_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` bool: column ``j`` of row ``i`` is a response token iff ``j < lengths[i]``."""
    return torch.arange(width)[None, :] < lengths[:, None]


@dataclass(frozen=True)
class PolicyBatch:
    """One optimizer step's data: picklable (tensors, ints, floats), CPU, float32.

    ``old_logprobs``: ``[B, T]``, the denominator of the importance ratio (the trainer's
    recompute at the rollout weights, or the engine's log-probs); ``advantages``: ``[B]``;
    ``weights``: ``[B, T]`` per-token weights multiplying each token's term (IS remedies,
    injected distortions), or None. ``nll`` needs none of the three; the clipped objectives need
    ``old_logprobs`` and ``advantages``. ``lr`` is the step's learning rate; ``max_grad_norm``
    clips the total gradient norm (None: no clip).
    """

    sequences: tuple[tuple[int, ...], ...]
    prompt_lengths: tuple[int, ...]
    objective: Objective
    lr: float
    old_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    max_grad_norm: float | None = MAX_GRAD_NORM
    #: the loss's denominator (see the module docstring); None: this batch's own
    loss_norm: float | None = field(default=None)
    #: the engine's MoE routes per sequence (``Completion.routes``), for a backend that trains
    #: with routing replay (R3); None for a dense model or an engine that reports none
    routes: tuple[Routes | None, ...] | None = None

    def __post_init__(self) -> None:
        b = len(self.sequences)
        if b == 0 or len(self.prompt_lengths) != b:
            raise UsageError(
                f"{b} sequences with {len(self.prompt_lengths)} prompt lengths",
                "pass one prompt length per sequence, at least one sequence",
            )
        pairs = zip(self.sequences, self.prompt_lengths, strict=True)
        if any(p < 1 or len(s) <= p for s, p in pairs):
            raise UsageError(
                "a sequence with an empty prompt or an empty response",
                "pass prompt lengths >= 1 and at least one response token per sequence",
            )
        if self.objective.kind != "nll" and (self.old_logprobs is None or self.advantages is None):
            raise UsageError(
                f"objective {self.objective.kind!r} without old log-probs or advantages",
                "pass old_logprobs [B, T] and advantages [B]",
            )
        shape = (b, self.width)
        for name in ("old_logprobs", "weights"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise UsageError(f"{name} of shape {tuple(value.shape)}", f"pass {shape}")
        if self.advantages is not None and tuple(self.advantages.shape) != (b,):
            raise UsageError(f"advantages of shape {tuple(self.advantages.shape)}", f"pass ({b},)")
        if self.loss_norm is None:
            own = float(self.lengths.sum()) if self.objective.kind == "nll" else float(b)
            object.__setattr__(self, "loss_norm", own)

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` response lengths ``n_i``."""
        pairs = zip(self.sequences, self.prompt_lengths, strict=True)
        return torch.tensor([len(s) - p for s, p in pairs])

    @property
    def width(self) -> int:
        """``T``, the longest response."""
        return int(self.lengths.max())

    @property
    def mask(self) -> torch.Tensor:
        return response_mask(self.lengths, self.width)

    def shard(self, index: int, count: int) -> PolicyBatch:
        """The ``index``-th of ``count`` contiguous, near-equal shards, with this batch's norm.

        Per-token tensors are cut to the shard's own longest response. A shard may be empty
        only if ``count > B``, which is refused.
        """
        b = len(self.sequences)
        if not 0 <= index < count <= b:
            raise UsageError(f"shard {index} of {count} over {b} sequences", "use count <= B")
        start, stop = index * b // count, (index + 1) * b // count
        width = int(self.lengths[start:stop].max())

        def cut(t: torch.Tensor | None, tokens: bool) -> torch.Tensor | None:
            if t is None:
                return None
            return t[start:stop, :width] if tokens else t[start:stop]

        return replace(
            self,
            sequences=self.sequences[start:stop],
            prompt_lengths=self.prompt_lengths[start:stop],
            old_logprobs=cut(self.old_logprobs, True),
            advantages=cut(self.advantages, False),
            weights=cut(self.weights, True),
            loss_norm=self.loss_norm,
            routes=None if self.routes is None else self.routes[start:stop],
        )

    def minibatches(self, count: int) -> list[PolicyBatch]:
        """``count`` contiguous, near-equal mini-batches, each normalised on its own: one
        optimizer step each (verl's ``ppo_mini_batch_size`` = B / count)."""
        return [replace(self.shard(i, count), loss_norm=None) for i in range(count)]


def response_logprobs(
    per_sequence: Sequence[torch.Tensor], prompt_lengths: Sequence[int]
) -> torch.Tensor:
    """``[B, T]`` response log-probs (or entropies) from a backend's ``Recompute`` lists.

    ``per_sequence[i]`` has ``len(s_i) − 1`` entries, entry ``t`` scoring ``s_i[t + 1]``; the
    response starts at entry ``p_i − 1``. Padded with 0; the autograd graph is kept.
    """
    return pad_sequence(
        [x[p - 1 :] for x, p in zip(per_sequence, prompt_lengths, strict=True)],
        batch_first=True,
    )


def policy_loss(
    logprobs: torch.Tensor, batch: PolicyBatch
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise on ``batch`` and its additive counts.

    ``logprobs``: ``[B, T]`` response log-probs at the current weights, with grad (aligned as in
    the module docstring). With ``N = batch.loss_norm``:

    - ``token-clip``: ``−(1/N) Σ_i (1/n_i) Σ_t w_{i,t} min(r Â_i, clip(r, 1 − ε_l, 1 + ε_h) Â_i)``,
      ``r = exp(lp − lp_old)`` (GRPO Eq. 2 with DAPO's decoupled clip);
    - ``seq-clip``: ``−(1/N) Σ_i (1/n_i) Σ_t w_{i,t} min(s_{i,t} Â_i, clip(s_{i,t}, 1 − ε_l,
      1 + ε_h) Â_i)``, ``s_{i,t} = sg[s_i] π(o_t)/sg[π(o_t)]``, ``s_i = exp(mean_t(lp − lp_old))``
      (GSPO-token; without weights, GSPO);
    - ``nll``: ``−(1/N) Σ_{i,t} lp_{i,t}`` (N = the token count: mean response NLL).

    Counts (floats, additive over shards): ``tokens``, ``sequences``, ``clip_low`` /
    ``clip_high`` (tokens whose gradient the lower / upper clip cut), ``clip_seq`` (sequences
    with at least one cut token; for ``seq-clip``, the clipped sequences), ``ratio_k3``
    (``Σ_t (r − 1 − log r)``, the k3 estimate of KL(π_old ‖ π_θ) from tokens sampled under the
    old policy, summed over tokens).
    """
    shape = (len(batch.sequences), batch.width)
    if tuple(logprobs.shape) != shape:
        raise UsageError(f"log-probs of shape {tuple(logprobs.shape)}", f"pass {shape}")
    mask = batch.mask
    counts = dict.fromkeys(COUNTS, 0.0)
    counts["tokens"] = float(mask.sum())
    counts["sequences"] = float(shape[0])
    kind = batch.objective.kind
    if kind == "nll":
        loss = -torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum() / batch.loss_norm
        return loss, counts
    assert batch.old_logprobs is not None and batch.advantages is not None  # __post_init__
    old = batch.old_logprobs.to(logprobs.dtype)
    adv = batch.advantages.to(logprobs.dtype)
    if kind == "seq-clip":
        surrogate = gspo_surrogate(logprobs, old, adv, mask, batch.objective.eps, batch.weights)
    else:
        surrogate = clipped_surrogate(logprobs, old, adv, mask, batch.weights, batch.objective.eps)
    cut = surrogate.clipped_low | surrogate.clipped_high
    log_r = torch.where(mask, logprobs.detach() - old, torch.zeros_like(old))
    counts["clip_low"] = float(surrogate.clipped_low.sum())
    counts["clip_high"] = float(surrogate.clipped_high.sum())
    counts["clip_seq"] = float(cut.any(dim=1).sum())
    counts["ratio_k3"] = float((torch.exp(log_r) - 1 - log_r).sum())
    return -surrogate.per_sequence.sum() / batch.loss_norm, counts


def step_stats(updates: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One RL step's figures from its updates' ``Backend.update`` results.

    ``loss`` and ``grad_norm`` are means over the updates (``grad_norm_max`` their max); clip
    fractions are over all the step's tokens (``clip_low``, ``clip_high``, ``clip_fraction`` =
    both) and sequences (``clip_seq``); ``ratio_kl`` is the mean k3 per token.
    """
    total = {k: sum(float(u[k]) for u in updates) for k in COUNTS}
    tokens, sequences = max(total["tokens"], 1.0), max(total["sequences"], 1.0)
    norms = [float(u["grad_norm"]) for u in updates]
    return {
        "updates": float(len(updates)),
        "loss": sum(float(u["loss"]) for u in updates) / len(updates),
        "grad_norm": sum(norms) / len(norms),
        "grad_norm_max": max(norms, default=math.nan),
        "clip_low": total["clip_low"] / tokens,
        "clip_high": total["clip_high"] / tokens,
        "clip_fraction": (total["clip_low"] + total["clip_high"]) / tokens,
        "clip_seq": total["clip_seq"] / sequences,
        "ratio_kl": total["ratio_k3"] / tokens,
    }
