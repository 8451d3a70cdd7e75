"""The support property, held on every suite's rollouts: no sampled token lies outside the
stated sampler's support (zero tolerance).

A token the sampler should have cut has processed probability 0: a trainer that recomputes
the processed distribution gets −inf and an infinite importance ratio (a masking race in a
fused sampler, transformers#23088; top-k/top-p composed in another order, sglang#36173). The
session runs :func:`audit_rollouts` on each batch an engine samples with top-k or top-p on,
while engine and backend hold the same weights, against the backend's tempered distribution
(:func:`conformance.sampling.outside_support`); the running check counts the tokens audited and
those outside (``support_tokens``, ``out_of_support_tokens``) and fails on the first outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conformance.engines.base import Completion, SamplingSpec
from conformance.sampling import SamplerOrder, outside_support


@dataclass(frozen=True)
class SupportAudit:
    """What one batch's audit found: tokens audited, tokens outside, and the first of those."""

    tokens: int
    outside: int
    #: "completion R token T at step S" for the first token outside, or ""
    first: str = ""


def truncates(spec: SamplingSpec) -> bool:
    """Whether ``spec`` cuts the distribution (top-k or top-p on); without, every token with a
    finite raw log-probability is in the support and the nonfinite count covers the rest."""
    return bool(spec.top_k) or spec.top_p < 1.0


def audit_rollouts(
    backend: Any,
    spec: SamplingSpec,
    completions: Sequence[Completion],
    *,
    order: SamplerOrder,
    margin: float,
) -> SupportAudit:
    """Audit ``completions`` sampled under ``spec`` against ``backend``'s distribution.

    ``margin``: the per-token log-prob difference between engine and backend allowed at the
    support's boundary (the profile's ``abs_diff_max``).
    """
    import torch

    rows = [c for c in completions if c.tokens]
    if not rows:
        return SupportAudit(0, 0)
    distributions = backend.next_token_logprobs(
        [c.sequence for c in rows], temperature=spec.temperature
    )
    # position len(prompt) − 1 onwards predicts the sampled tokens
    logp = torch.cat(
        [torch.as_tensor(d)[len(c.prompt) - 1 :] for c, d in zip(rows, distributions, strict=True)]
    )
    tokens = torch.tensor([t for c in rows for t in c.tokens])
    outside = outside_support(
        logp,
        tokens,
        temperature=spec.temperature,
        top_k=spec.top_k,
        top_p=spec.top_p,
        order=order,
        margin=margin,
    )
    count = int(outside.sum())
    if not count:
        return SupportAudit(tokens.numel(), 0)
    flat = int(outside.nonzero()[0])
    starts = torch.tensor([0, *(len(c.tokens) for c in rows)]).cumsum(0)
    row = int((starts <= flat).sum()) - 1
    step = flat - int(starts[row])
    first = f"completion {completions.index(rows[row])} token {tokens[flat]} at step {step}"
    return SupportAudit(tokens.numel(), count, first)
