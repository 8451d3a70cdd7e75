"""Goodness of fit of sampled tokens to a stated next-token distribution (sampler fidelity).

Pure functions, float64 inside, plain floats out. A sampler that draws token ``o_i`` from the
distribution ``p_i`` at each position makes the randomized probability integral transforms
``u_i`` (:func:`randomized_pit`) independent and uniform on (0, 1) whatever the ``p_i`` are, so
one uniformity test (:func:`uniformity_pvalue`) covers every position, prompt and sampling spec
at once.
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


def uniformity_pvalue(u: torch.Tensor, bins: int) -> float:
    """The smaller of the KS and the ``bins``-bin χ² p-values, doubled (Bonferroni over the
    two tests), capped at 1: one p-value with the power of each test where it is strongest."""
    return min(1.0, 2.0 * min(ks_uniform_pvalue(u), chi2_uniform_pvalue(u, bins)))
