"""Goodness of fit of sampled tokens to a stated next-token distribution (sampler fidelity).

Pure functions, float64 inside, plain floats out. A sampler that draws token ``o_i`` from the
distribution ``p_i`` at each position makes the randomized probability integral transforms
``u_i`` (:func:`randomized_pit`) independent and uniform on (0, 1) whatever the ``p_i`` are, so
one uniformity test covers every position, prompt and sampling spec at once; where one token
holds nearly all the mass, the count of top-token draws (:func:`top_token_pvalue`) sees what
uniformity cannot, and :func:`fidelity_pvalue` joins them.
"""

from __future__ import annotations

import math

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
