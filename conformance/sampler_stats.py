"""Goodness of fit of sampled tokens to a stated next-token distribution (sampler fidelity).

Pure functions, float64 inside, plain floats out. A sampler that draws token ``o_i`` from the
distribution ``p_i`` at each position makes the randomized probability integral transforms
``u_i`` (:func:`randomized_pit`) independent and uniform on (0, 1) whatever the ``p_i`` are, so
one uniformity test covers every position, prompt and sampling spec at once; where one token
holds nearly all the mass, the count of top-token draws (:func:`top_token_pvalue`) sees what
uniformity cannot, and :func:`fidelity_pvalue` joins them. The sampled tokens' own
log-probabilities have a known distribution under ``p`` too: their standardized sum
(:func:`logp_score`) is the most powerful test against a sampler uniformly sharper or flatter
than stated, a shift that stays inside the support.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

_F64 = torch.float64


def randomized_pit(logp: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    r"""Randomized probability integral transform of sampled tokens.

    With the vocabulary ordered by descending probability under ``p`` (ties by token id),
    ``u = F(o−) + v · p(o)``: the mass of the tokens ranked above the sampled one ``o``, plus
    a uniform ``v`` share of its own. If ``o ~ p`` and ``v ~ U(0, 1)`` independently, then
    ``u ~ U(0, 1)`` exactly, for discrete ``p`` too (Brockwell 2007, "Universal residuals: a
    multivariate transformation", Stat. Probab. Lett. 77; Czado, Gneiting & Held 2009,
    Biometrics 65, §2.1), and ``u``s of successive positions are independent given their
    prefixes, so a whole rollout's are i.i.d. uniform. Any order fixed by ``p`` keeps that; the
    descending one makes a sampler that is too hot (or keeps tokens it should cut) push ``u``
    towards 1, and one too cold towards 0. A token ``p`` gives no mass gets ``u = F(o−) = 1``
    when it ranks below the whole support.

    Args:
        logp: ``[N, V]`` log-probabilities of the stated (processed) distribution per position.
        tokens: ``[N]`` the sampled token ids.
        noise: ``[N]`` independent U(0, 1) draws.

    Returns:
        ``[N]`` float64 values in [0, 1].
    """
    p = logp.to(_F64).exp()
    p_o = p.gather(-1, tokens.reshape(-1, 1)).squeeze(-1)
    ids = torch.arange(p.shape[-1])
    # tokens ranked above o: more probable, or as probable with a smaller id
    above = (p > p_o[:, None]) | ((p == p_o[:, None]) & (ids[None, :] < tokens.reshape(-1, 1)))
    below_mass = (p * above).sum(-1)
    return (below_mass + noise.to(_F64) * p_o).clamp_(0.0, 1.0)


def ks_uniform_pvalue(u: torch.Tensor) -> float:
    r"""P-value of the one-sample Kolmogorov–Smirnov test of ``u`` against U(0, 1).

    ``D = max_i max(i/n − u_(i), u_(i) − (i−1)/n)`` over the sorted ``u``; the p-value is the
    Kolmogorov limit ``Q(λ) = 2 Σ_{k≥1} (−1)^{k−1} e^{−2k²λ²}`` at Stephens' finite-n
    correction ``λ = (√n + 0.12 + 0.11/√n) D`` (Stephens 1970, J. R. Stat. Soc. B 32;
    Numerical Recipes §14.3.3), accurate to a few per cent of p for n ≥ 5 and closer as n
    grows: the thousands of tokens a sampler test needs.
    """
    n = u.numel()
    ordered = u.to(_F64).reshape(-1).sort().values
    ranks = torch.arange(1, n + 1, dtype=_F64)
    d = float(torch.maximum(ranks / n - ordered, ordered - (ranks - 1) / n).max())
    root = math.sqrt(n)
    lam = (root + 0.12 + 0.11 / root) * d
    if lam < 0.2:  # the series converges slowly there; Q is 1 to 15 digits
        return 1.0
    total = sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, 2.0 * total))


def chi2_uniform_pvalue(u: torch.Tensor, bins: int) -> float:
    r"""P-value of Pearson's χ² test of ``u`` against U(0, 1) over ``bins`` equal bins.

    ``X² = Σ_b (n_b − n/B)² / (n/B)``, referred to χ² with ``B − 1`` degrees of freedom:
    ``p = Q((B − 1)/2, X²/2)``, the regularized upper incomplete gamma function (Pearson 1900;
    valid while every expected count ``n/B`` is at least about 5). Where KS reads the whole
    distribution function and so sees a shift best, the bins see a few per cent of the mass
    piled into one place (a token the sampler should have cut lands at ``u`` near 1).
    """
    n = u.numel()
    counts = torch.bincount((u.to(_F64).reshape(-1) * bins).long().clamp_(0, bins - 1), None, bins)
    expected = n / bins
    statistic = float(((counts.to(_F64) - expected) ** 2).sum() / expected)
    dof = torch.tensor((bins - 1) / 2.0, dtype=_F64)
    return float(torch.special.gammaincc(dof, torch.tensor(statistic / 2.0, dtype=_F64)))


def top_token_pvalue(logp: torch.Tensor, tokens: torch.Tensor) -> float:
    r"""Two-sided exact p-value of how often the sampled token is the most probable one.

    With ``q_i = max_t p_i(t)`` (ties by token id, as :func:`randomized_pit` ranks them), a
    faithful sampler draws the top token ``X = Σ_i 1[o_i = argmax p_i]`` times, ``X`` Poisson-
    binomial with success probabilities ``q_i`` (Wang 1993, "On the number of successes in
    independent trials", Stat. Sin. 3), ``P(X = k)`` the coefficient of ``z^k`` in
    ``Π_i (1 − q_i + q_i z)`` (exact up to rounding of about 1e-15 per probability), and
    ``p = min(1, 2·min(P(X ≤ x), P(X ≥ x)))``. Where one token holds nearly all the
    mass, the PIT puts that token's draws anywhere in [0, q) and a sampler too cold moves only
    the ``1 − q`` tail's few draws: at ``q = 0.99`` over 2,048 draws, KS and χ² read p = 1 for
    a sampler at half the temperature, which draws the top token 2,048 times where 2,028 ± 4.5
    were due.

    Args:
        logp: ``[N, V]`` log-probabilities of the stated (processed) distribution per position.
        tokens: ``[N]`` the sampled token ids.
    """
    top = logp.to(_F64).max(-1)
    drawn = int((top.indices == tokens.reshape(-1)).sum())
    pmf = _poisson_binomial_pmf(top.values.exp())
    low, high = float(pmf[: drawn + 1].sum()), float(pmf[drawn:].sum())
    return min(1.0, 2.0 * min(low, high))


def _poisson_binomial_pmf(q: torch.Tensor) -> torch.Tensor:
    """``P(X = k)``, k = 0..N, of a sum of independent Bernoulli(``q_i``): the coefficients of
    ``Π_i (1 − q_i + q_i z)``, multiplied pairwise in a tree by FFT convolution."""
    polys = torch.stack([1 - q, q], dim=-1)
    while polys.shape[0] > 1:
        if polys.shape[0] % 2:
            one = torch.zeros(1, polys.shape[1], dtype=polys.dtype)
            one[0, 0] = 1.0
            polys = torch.cat([polys, one])
        size = 2 * polys.shape[1] - 1
        product = torch.fft.rfft(polys[0::2], n=size) * torch.fft.rfft(polys[1::2], n=size)
        polys = torch.fft.irfft(product, n=size)
    return polys[0, : q.numel() + 1].clamp(min=0.0)


def fidelity_pvalue(logp: torch.Tensor, tokens: torch.Tensor, u: torch.Tensor, bins: int) -> float:
    """One p-value that sampled ``tokens`` follow ``logp``: the smallest of the KS and the
    ``bins``-bin χ² p-values of their PITs ``u`` (:func:`randomized_pit`) and the top-token
    count's (:func:`top_token_pvalue`), tripled (Bonferroni over the three), capped at 1: each
    test's power where it is strongest, the false-alarm rate at most the bound it is held to."""
    tests = (ks_uniform_pvalue(u), chi2_uniform_pvalue(u, bins), top_token_pvalue(logp, tokens))
    return min(1.0, 3.0 * min(tests))


class LogpScore(NamedTuple):
    """:func:`logp_score`'s reading of a run's sampled tokens."""

    #: ``Σ (S_t − E_t) / √(Σ Var_t)``: about N(0, 1) for a faithful sampler, positive for a
    #: sharper one, negative for a flatter one
    z: float
    #: two-sided p-value of the sum, its tails by saddlepoint
    p_value: float
    #: ``β̂``: the draws look drawn from ``p^β̂`` renormalised (1 for a faithful sampler)
    power: float


#: rows per block of the saddlepoint's sums: a 49,152-token vocabulary's float64 block is 100 MB
_ROWS = 256


def logp_score(logp: torch.Tensor, tokens: torch.Tensor) -> LogpScore:
    r"""How far the sampled tokens' log-probabilities sum from what ``p`` predicts.

    At position ``t`` a token drawn from ``p_t`` has ``S_t = log p_t(o_t)`` with mean
    ``E_t = −H(p_t) = Σ_v p_t(v) log p_t(v)`` and variance ``Var_t = Σ_v p_t(v) (log p_t(v) −
    E_t)²``, independent across positions given their prefixes, so
    ``Z = Σ_t (S_t − E_t) / √(Σ_t Var_t)`` is N(0, 1) for a faithful sampler as the positions
    grow (Lindeberg's CLT; for a martingale-difference sum, Hall & Heyde 1980, *Martingale Limit
    Theory*, Thm 3.2). It is the score statistic at ``β = 1`` of the tempered family
    ``q_β ∝ p^β`` (the cumulant generating function of ``S_t`` is
    ``K_t(s) = log Σ_v p_t(v)^{1+s}``, the tilted ``p`` is ``p^{1+s}``), so the locally most
    powerful test against a sampler sharper (``β > 1``, ``Z > 0``) or flatter than stated
    (Cox & Hinkley 1974, *Theoretical Statistics*, §4.8). A small tempering ``β = 1 + ε``
    moves ``E[S_t]`` by ``ε·Var_t`` at a total variation ``δ_t = ε·MAD_t/2`` (``MAD_t``: the
    mean absolute deviation of ``log p_t``), so a sampler off by ``δ`` at every position moves
    ``Z`` by ``2δ·Σ_t σ_t r_t / √(Σ_t σ_t²)``, ``r_t = σ_t/MAD_t ≥ 1``: ``2δ√n·r`` where the
    positions are alike, 4.5·r at δ = 0.05 over 2,048 draws, against 2.3 σ for KS
    (``√n·D``, and ``D = δ`` for a tempering: the PIT's distribution function crosses ``u``
    once, at the mass of the tokens it favours).

    ``S_t`` is skewed where one token holds most of the mass (a rare draw reads many nats), so
    the tails are not read off the normal: ``P(Σ S ≥ x)`` is the Lugannani–Rice saddlepoint
    approximation ``1 − Φ(w) + φ(w) (1/u − 1/w)``, ``w = sgn(ŝ) √(2(ŝx − K(ŝ)))``,
    ``u = ŝ √K''(ŝ)``, ``K = Σ_t K_t`` and ``K'(ŝ) = x`` (Lugannani & Rice 1980, Adv. Appl.
    Probab. 12; Butler 2007, *Saddlepoint Approximations with Applications*, §1.2), relative
    error ``O(1/n)`` uniformly into the far tails; the two-sided p-value is twice the smaller
    tail. ``ŝ`` is the maximum-likelihood tempering, ``β̂ = 1 + ŝ``.

    Tokens ``p`` gives no mass (outside the support) are left out: the support audit holds
    those to zero.

    Args:
        logp: ``[N, V]`` log-probabilities of the stated (processed) distribution per position.
        tokens: ``[N]`` the sampled token ids.
    """
    logp = _renormalised(logp)
    drawn = logp.gather(-1, tokens.reshape(-1, 1)).squeeze(-1)
    kept = torch.isfinite(drawn)
    logp, drawn = logp[kept], drawn[kept]
    x = float(drawn.sum())
    mean, var = _tilted(logp, 0.0)[1:]
    if var <= 0.0:  # every kept position certain: nothing to test
        return LogpScore(0.0, 1.0, 1.0)
    lower, upper, s = logp_sum_tails(logp, x)
    p_value = min(1.0, 2.0 * min(lower, upper))
    return LogpScore((x - mean) / math.sqrt(var), p_value, 1.0 + s)


def logp_sum_tails(logp: torch.Tensor, x: float) -> tuple[float, float, float]:
    """``P(Σ_t S_t ≤ x)``, ``P(Σ_t S_t ≥ x)`` and the saddlepoint ``ŝ`` for tokens drawn from
    ``logp``'s rows (−inf: outside the support), by Lugannani–Rice (:func:`logp_score`)."""
    logp = _renormalised(logp)
    _, mean, var = _tilted(logp, 0.0)
    z = (x - mean) / math.sqrt(var)
    s = _saddlepoint(logp, x, z / math.sqrt(var))
    if abs(z) < 1.0:
        # within a standard deviation 1/u − 1/w is a difference of two large numbers that
        # rounding in K swamps (Butler 2007, §2.3.2); the tails there are near 1/2 either way
        upper = 0.5 * math.erfc(z / math.sqrt(2.0))
        return 1.0 - upper, upper, s
    k, _, k2 = _tilted(logp, s)
    w = math.copysign(math.sqrt(max(0.0, 2.0 * (s * x - k))), s)
    u = s * math.sqrt(k2)
    density = math.exp(-0.5 * w * w) / math.sqrt(2.0 * math.pi)
    correction = density * (1.0 / u - 1.0 / w)
    upper = 0.5 * math.erfc(w / math.sqrt(2.0)) + correction
    lower = 0.5 * math.erfc(-w / math.sqrt(2.0)) - correction
    return min(1.0, max(0.0, lower)), min(1.0, max(0.0, upper)), s


def _renormalised(logp: torch.Tensor) -> torch.Tensor:
    """``logp`` in float64, each row's support renormalised there: rows renormalised in
    float32 sum to 1 ± 1e-7, and over 2,048 rows that offset in ``K(0)`` outweighs the
    ``ŝx − K(ŝ)`` the tails are read from near the centre."""
    logp = logp.to(_F64)
    return logp - logp.logsumexp(-1, keepdim=True)


def _tilted(logp: torch.Tensor, s: float) -> tuple[float, float, float]:
    """``K(s)``, ``K'(s)``, ``K''(s)`` of ``Σ_t S_t``: the log-normalisers, means and variances
    of ``log p`` under ``p^{1+s}`` renormalised, summed over the positions (−inf entries are
    outside the support at every ``s``)."""
    k = k1 = k2 = 0.0
    for block in logp.split(_ROWS):
        finite = torch.isfinite(block)
        ell = torch.where(finite, block, 0.0)
        tilted = torch.where(finite, (1.0 + s) * ell, -math.inf)
        norm = tilted.logsumexp(-1, keepdim=True)
        q = (tilted - norm).exp()
        mean = (q * ell).sum(-1, keepdim=True)
        k += float(norm.sum())
        k1 += float(mean.sum())
        k2 += float((q * (ell - mean) ** 2).sum())
    return k, k1, k2


def _saddlepoint(logp: torch.Tensor, x: float, start: float) -> float:
    """The ``s`` with ``K'(s) = x``: Newton's steps from the normal's guess, kept inside a
    bracket that each step's sign of ``K'(s) − x`` narrows (``K'`` increases: ``K'' ≥ 0``);
    ``x`` at or past what any draw reaches gives the bracket's end, ±50 (``p^51``: the top
    token alone, to float64)."""
    lo, hi, s = -50.0, 50.0, max(-50.0, min(50.0, start))
    for _ in range(100):
        _, k1, k2 = _tilted(logp, s)
        if k1 < x:
            lo = s
        else:
            hi = s
        step = s - (k1 - x) / k2 if k2 > 0 else math.nan
        s = step if lo < step < hi else (lo + hi) / 2.0
        if hi - lo < 1e-12 or abs(k1 - x) < 1e-10 * max(1.0, abs(x)):
            break
    return s
