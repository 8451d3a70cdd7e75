"""The stated sampler: how temperature, min-p, top-k and top-p compose, and its support.

The one place that says what "the distribution the sampling spec names" is. The stated
sampler is vLLM's (``MinPLogitsProcessor``, then ``TopKTopPSampler``): logits / temperature;
then min-p, the tokens whose probability is at least ``min_p`` times the most likely one's; then
the top k of those; then the smallest set of the most likely of those whose mass, renormalised
over what is left, reaches top-p. Without min-p it is transformers' too
(``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``, in that order), whose
``MinPLogitsWarper`` comes last instead. An engine composing them otherwise declares it
(``capabilities.sampler_order``); the suites then hold its tokens to its declared order, and an
engine that does not declare it is held to the stated one.

Min-p keeps an upper set of the tempered distribution (``p_i ≥ min_p · p_max`` is unchanged by
renormalising any set holding the most likely token), so applied last it intersects; applied
first it also shrinks the set top-p renormalises over, and so the nucleus.

:func:`outside_support` says which sampled tokens no sampler of that order could have drawn,
allowing each token's log-probability to differ between engine and backend by the profile's
per-token bound: the zero-tolerance support property counts them for every suite's rollouts.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class SamplerOrder(enum.StrEnum):
    """How a sampler composes min-p, top-k and top-p (temperature always first)."""

    #: the stated sampler: min-p, then top-k, then top-p over the renormalised rest (vLLM)
    TOP_K_THEN_TOP_P = "top-k-then-top-p"
    #: top-k, then top-p over the renormalised top k, then min-p (transformers' warpers)
    MIN_P_LAST = "top-k-then-top-p-then-min-p"
    #: the nucleus of the whole distribution intersected with the top k and the min-p set
    #: (FlashInfer's ``filter_apply_order="joint"``; SGLang's torch sampler, and its min-p path
    #: before sglang#36173)
    JOINT = "joint"


#: the order every engine is held to unless it declares another
STATED_ORDER = SamplerOrder.TOP_K_THEN_TOP_P
#: probability mass a sampler's float32 cumulative sum may be off at the top-p boundary: a
#: token whose mass above it exceeds top-p by less is not called outside. A float32 sum of V
#: probabilities errs by about √V·2^-24 (1e-6 at 384 tokens, 1e-5 at 150k) and at worst by
#: V·2^-24; near-ties at the boundary, which move whole tokens' mass, are the margin's to cover
MASS_SLACK = 1e-4


def truncate(
    logp: torch.Tensor,
    top_k: int,
    top_p: float,
    order: SamplerOrder = STATED_ORDER,
    *,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Renormalised log-probabilities over the tokens the sampler of ``order`` keeps; −inf
    elsewhere. ``logp`` holds tempered log-probabilities; ``top_k = 0``, ``top_p = 1`` and
    ``min_p = 0`` are off.

    ``TOP_K_THEN_TOP_P``: the tokens with ``p ≥ min_p · p_max``, the top k of those, then the
    smallest set of the most likely of those whose mass (renormalised over them) reaches
    ``top_p``. ``MIN_P_LAST``: the top k, the top-p set over the renormalised k, then those with
    ``p ≥ min_p · p_max``. ``JOINT``: the top k tokens that are also in the smallest set of the
    most likely tokens whose mass *in the whole distribution* reaches ``top_p``, and have
    ``p ≥ min_p · p_max``. A token stays under top-p if the mass ranked above it is short of
    ``top_p``; the most likely token always stays.
    """
    import torch

    sorted_lp, order_ids = logp.sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_lp, dtype=torch.bool)
    in_min_p = (
        sorted_lp >= sorted_lp[..., :1] + math.log(min_p) if min_p > 0 else torch.ones_like(keep)
    )
    if order is SamplerOrder.TOP_K_THEN_TOP_P:
        keep &= in_min_p
    if top_p < 1.0 and order is SamplerOrder.JOINT:
        keep &= _mass_before(sorted_lp) < top_p
    if top_k:
        keep[..., top_k:] = False
    if top_p < 1.0 and order is not SamplerOrder.JOINT:
        # a token stays if the mass of the kept tokens ranked above it is still short of top_p
        rest = sorted_lp.masked_fill(~keep, -torch.inf)
        keep &= _mass_before(rest - rest.logsumexp(-1, keepdim=True)) < top_p
    keep &= in_min_p
    keep[..., 0] = True
    kept = sorted_lp.masked_fill(~keep, -torch.inf)
    kept = kept - kept.logsumexp(-1, keepdim=True)
    return torch.full_like(logp, -torch.inf).scatter(-1, order_ids, kept)


def _mass_before(sorted_lp: torch.Tensor) -> torch.Tensor:
    """The mass ranked above each token of a descending row of log-probabilities."""
    p = sorted_lp.exp()
    return p.cumsum(-1) - p


def outside_support(
    logp: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float = 0.0,
    order: SamplerOrder = STATED_ORDER,
    margin: float = 0.0,
    slack: float = MASS_SLACK,
) -> torch.Tensor:
    r"""Which sampled tokens lie outside the support of the sampler ``order`` names.

    ``logp`` ``[N, V]`` holds the backend's tempered log-probabilities ``l = log_softmax(z/T)``
    (no min-p/top-k/top-p) at each sampled position, ``tokens`` ``[N]`` the sampled ids. The
    engine's raw log-probabilities may differ from the backend's by up to ``margin`` nats per
    token (the profile's ``abs_diff_max``), so two tokens' tempered log-probabilities by up to
    ``δ = 2·margin/T``. A token ``o`` is outside only if it is for every engine within that:

    - min-p: outside if ``l_o + δ < l_max + log(min_p)``;
    - ``A = {j : l_j > l_o + δ}``, the tokens ranked above ``o`` on the engine too;
    - top-k: outside if ``|A| ≥ k``;
    - top-p: outside if ``e^{−δ} Σ_A p_j / Σ_{R} p_j ≥ top_p + slack``, the least mass the
      engine can put above ``o``, renormalised over the most mass the set top-p cuts from can
      hold: ``R`` = the k most likely tokens (the whole vocabulary when top-k is off, or for
      ``JOINT``, which takes the nucleus of the whole), and for the stated order only those
      with ``l_j ≥ l_max + log(min_p) − δ``.

    Ties at the top-k boundary are inside (``A`` counts strictly larger ones only) and the top-p
    boundary has ``slack`` of mass for the sampler's float32 cumulative sum.

    Returns:
        ``[N]`` bool, True where the token is outside.
    """
    import torch

    lp = logp.to(torch.float64)
    p = lp.exp()
    lp_o = lp.gather(-1, tokens.reshape(-1, 1))
    lp_max = lp.amax(-1, keepdim=True)
    delta = 2.0 * margin / temperature
    above = lp > lp_o + delta
    outside = torch.zeros(lp.shape[0], dtype=torch.bool)
    if min_p > 0:
        outside |= (lp_o + delta < lp_max + math.log(min_p))[:, 0]
    if top_k:
        outside |= above.sum(-1) >= top_k
    if top_p < 1.0:
        # the set top-p renormalises over: the whole vocabulary for JOINT
        rest = torch.ones_like(p, dtype=torch.bool)
        if min_p > 0 and order is SamplerOrder.TOP_K_THEN_TOP_P:
            rest &= lp >= lp_max + math.log(min_p) - delta
        if top_k and order is not SamplerOrder.JOINT:
            ranked = p.masked_fill(~rest, 0.0)
            rest &= ranked >= ranked.topk(min(top_k, p.shape[-1]), dim=-1).values[:, -1:]
        mass_above = (p * above).sum(-1) / (p * rest).sum(-1)
        outside |= mass_above * math.exp(-delta) >= top_p + slack
    return outside
