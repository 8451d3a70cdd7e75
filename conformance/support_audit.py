"""The support property, held on every suite's rollouts: no sampled token lies outside the
stated sampler's support (zero tolerance).

A token the sampler should have cut has processed probability 0: a trainer that recomputes
the processed distribution gets −inf and an infinite importance ratio (a masking race in a
fused sampler, transformers#23088; top-k/top-p composed in another order, sglang#36173). The
session (:class:`~conformance.session_audit.SessionAudit`) runs :func:`audit_rollouts` on each
batch an engine samples with min-p, top-k or top-p on, while engine and backend hold the same
weights, against the backend's tempered distribution
(:func:`conformance.sampling.outside_support`); the running check counts the tokens audited and
those outside (``support_tokens``, ``out_of_support_tokens``) and fails on the first outside. A
batch the check has already found clean (a seeded rerun) is not audited again (:func:`audit_key`).

The audit judges the sampler given the logits: it allows the engine's log-probs the profile's
per-token difference from the backend's. A rollout whose reported raw log-probs differ by more
somewhere was sampled from other logits (a numerics defect, which the check's parity property
judges): a token outside the backend's support there would blame the sampler for the logits, so
that rollout is not audited.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from conformance.engines.base import Completion, SamplingSpec
from conformance.sampling import SamplerOrder, outside_support

if TYPE_CHECKING:
    from conformance.backends import Backend
    from conformance.engines.base import Request


@dataclass(frozen=True)
class SupportAudit:
    """What one batch's audit found: tokens audited, tokens outside, and the first of those."""

    tokens: int
    outside: int
    #: "completion R token T at step S" for the first token outside, or ""
    first: str = ""


def truncates(spec: SamplingSpec) -> bool:
    """Whether ``spec`` cuts the distribution (min-p, top-k or top-p on); without, every token
    with a finite raw log-probability is in the support and the nonfinite count covers the
    rest."""
    return bool(spec.top_k) or spec.top_p < 1.0 or spec.min_p > 0


def sampled_batches(
    method: str, args: tuple[object, ...], result: object
) -> list[tuple[SamplingSpec, list[Completion], list[int] | None]]:
    """The batches an engine call sampled under a spec that truncates, to audit each under its
    own spec: ``(spec, completions, rows)``, ``rows`` the request index of each completion for
    a mixed batch (``Engine.generate_requests``, grouped by spec) and ``None`` for ``generate``
    (``args``: the call's, its spec second; ``result``: its completions). Other calls sampled
    nothing: ``[]``."""
    if method == "generate":
        spec = cast("SamplingSpec", args[1])
        return [(spec, list(cast("Sequence[Completion]", result)), None)] if truncates(spec) else []
    if method != "generate_requests":
        return []
    completions = cast("Sequence[Completion]", result)
    by_spec: dict[SamplingSpec, list[int]] = {}
    for row, request in enumerate(cast("Sequence[Request]", args[0])):
        if truncates(request.spec):
            by_spec.setdefault(request.spec, []).append(row)
    return [(spec, [completions[r] for r in rows], rows) for spec, rows in by_spec.items()]


def audit_key(
    spec: SamplingSpec,
    completions: Sequence[Completion],
    *,
    order: SamplerOrder,
    margin: float,
    raw_logprobs: bool,
) -> str:
    """A digest of everything :func:`audit_rollouts` reads besides the backend's weights: the
    spec, each completion's prompt, tokens and reported log-probs, and the audit's arguments.
    Equal keys under the same weights give the same finding."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((spec, order, margin, raw_logprobs)).encode())
    for c in completions:
        digest.update(repr((c.prompt, c.tokens, c.logprobs)).encode())
    return digest.hexdigest()


#: positions whose whole next-token distribution is recomputed at once: a deep batch's 65,536
#: tokens over a 49,152-token vocabulary would be 13 GB of log-probs, 4,096 positions are 0.8 GB
AUDIT_POSITIONS = 4096


def audit_rollouts(
    backend: Backend,
    spec: SamplingSpec,
    completions: Sequence[Completion],
    *,
    order: SamplerOrder,
    margin: float,
    raw_logprobs: bool = True,
) -> SupportAudit:
    """Audit ``completions`` sampled under ``spec`` against ``backend``'s distribution, a few
    thousand positions at a time (``AUDIT_POSITIONS``).

    ``margin``: the per-token log-prob difference between engine and backend allowed at the
    support's boundary (the profile's ``abs_diff_max``). ``raw_logprobs``: the completions report
    raw log-probs, so rollouts differing from the backend's by more than ``margin`` can be told
    apart and are left unaudited (processed ones are all audited).
    """
    rows = [c for c in completions if c.tokens]
    tokens, outside, first = 0, 0, ""
    for chunk in _chunks(rows):
        found = _audit(backend, spec, chunk, order=order, margin=margin, raw=raw_logprobs)
        if found.outside and not first:
            completion, rest = found.first.split(" ", 1)
            first = f"completion {completions.index(chunk[int(completion)])} {rest}"
        tokens, outside = tokens + found.tokens, outside + found.outside
    return SupportAudit(tokens, outside, first)


def _chunks(rows: Sequence[Completion]) -> list[list[Completion]]:
    chunks: list[list[Completion]] = []
    size = 0
    for row in rows:
        if not chunks or size + len(row.sequence) > AUDIT_POSITIONS:
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += len(row.sequence)
    return chunks


def _audit(
    backend: Backend,
    spec: SamplingSpec,
    rows: Sequence[Completion],
    *,
    order: SamplerOrder,
    margin: float,
    raw: bool,
) -> SupportAudit:
    """One chunk's audit; ``first`` reads "I token T at step S", I the row's index in ``rows``."""
    import torch

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
        min_p=spec.min_p,
        order=order,
        margin=margin,
    )
    lengths = [len(c.tokens) for c in rows]
    audited = torch.ones_like(outside)
    if raw and margin > 0:
        # log_softmax(T · l) is the raw distribution again: l = z/T − logsumexp(z/T)
        backend_raw = torch.log_softmax(spec.temperature * logp.to(torch.float64), -1)
        backend_raw = backend_raw.gather(-1, tokens.reshape(-1, 1))[:, 0]
        reported = torch.tensor([lp for c in rows for lp in c.logprobs], dtype=torch.float64)
        # NaN compares false: a nonfinite log-prob is a mismatch too
        agrees = (reported - backend_raw).abs() <= margin
        per_row = torch.stack([part.all() for part in agrees.split(lengths)])
        audited = per_row.repeat_interleave(torch.tensor(lengths))
    outside &= audited
    count = int(outside.sum())
    if not count:
        return SupportAudit(int(audited.sum()), 0)
    flat = int(outside.nonzero()[0])
    starts = torch.tensor([0, *lengths]).cumsum(0)
    row = int((starts <= flat).sum()) - 1
    step = flat - int(starts[row])
    return SupportAudit(int(audited.sum()), count, f"{row} token {tokens[flat]} at step {step}")
