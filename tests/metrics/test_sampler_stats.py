"""The sampler-fidelity statistics: the randomized PIT is uniform exactly when tokens are drawn
from the stated distribution, and the p-values match their reference distributions."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.sampler_stats import (
    chi2_uniform_pvalue,
    fidelity_pvalue,
    ks_uniform_pvalue,
    randomized_pit,
    top_token_pvalue,
)

N, VOCAB, BINS = 4000, 64, 20


def _draw(logits: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)
    return tokens, torch.rand(tokens.numel(), generator=gen)


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    # peaked and flat positions, with exact ties (an untrained model's repeated logits)
    gen = torch.Generator().manual_seed(7)
    values = torch.randn(N, VOCAB, generator=gen) * torch.rand(N, 1, generator=gen) * 6
    values[:, :8] = values[:, :1]
    return values


def test_the_pit_of_faithful_samples_is_uniform(logits):
    alarms = 0
    for seed in range(20):
        tokens, noise = _draw(logits, seed)
        logp = torch.log_softmax(logits, -1)
        u = randomized_pit(logp, tokens, noise)
        assert float(u.min()) >= 0.0 and float(u.max()) <= 1.0
        alarms += fidelity_pvalue(logp, tokens, u, BINS) < 1e-3
    # 20 tests at 1e-3: an alarm here has probability 2 %, two of them 2e-4
    assert alarms <= 1


@pytest.mark.parametrize("scale", [1.1, 0.9])
def test_a_sampler_at_the_wrong_temperature_is_found(logits, scale):
    tokens, noise = _draw(logits / scale, 1)
    logp = torch.log_softmax(logits, -1)
    u = randomized_pit(logp, tokens, noise)
    assert fidelity_pvalue(logp, tokens, u, BINS) < 1e-4
    # too hot draws less likely tokens: PITs move towards 1
    assert (float(u.mean()) > 0.5) == (scale > 1)


def test_a_token_outside_the_support_gets_one():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.0]]))
    u = randomized_pit(logp, torch.tensor([2]), torch.tensor([0.3]))
    assert float(u) == pytest.approx(1.0)


def test_ks_pvalue_matches_the_kolmogorov_critical_values():
    # the asymptotic 5 % and 0.1 % critical values of √n·D are 1.358 and 1.949
    n = 10_000
    for critical, alpha in ((1.358, 0.05), (1.949, 0.001)):
        d = critical / (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n))
        u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        u = u + d - 0.5 / n  # every point shifted: D is exactly d
        assert ks_uniform_pvalue(u.clamp(0, 1)) == pytest.approx(alpha, rel=0.02)


def test_chi2_pvalue_matches_the_chi2_critical_value():
    # two bins, counts 60/40 of 100: X² = 4, χ²₁ upper tail at 4 is 0.0455
    u = torch.cat([torch.full((60,), 0.25), torch.full((40,), 0.75)])
    assert chi2_uniform_pvalue(u, 2) == pytest.approx(0.0455, abs=1e-4)


def _peaked(top: float, n: int = 2048, vocab: int = 256) -> torch.Tensor:
    """Logits where one token holds ``top`` of the mass at every position, the rest a random
    tail: a trained model answering a question."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(n, vocab, generator=gen) * 2
    logits[:, 0] = torch.logsumexp(logits[:, 1:], -1) + math.log(top / (1 - top))
    return logits


def test_faithful_samples_of_a_peaked_distribution_raise_no_more_alarms():
    logits = _peaked(0.99)
    logp = torch.log_softmax(logits, -1)
    alarms = 0
    for seed in range(20):
        tokens, noise = _draw(logits, seed)
        alarms += fidelity_pvalue(logp, tokens, randomized_pit(logp, tokens, noise), BINS) < 1e-3
    assert alarms <= 1


@pytest.mark.parametrize("scale", [0.5, 0.8, 1.2])
def test_a_wrong_temperature_on_a_peaked_distribution_is_found(scale):
    """One token at 0.99, 2,048 draws (one sampler-fidelity spec): the PIT puts the top
    token's draws anywhere in [0, 0.99), so KS and χ² barely see a colder sampler; the count
    of top-token draws does."""
    logits = _peaked(0.99)
    logp = torch.log_softmax(logits, -1)
    tokens, noise = _draw(logits / scale, 11)
    u = randomized_pit(logp, tokens, noise)
    assert fidelity_pvalue(logp, tokens, u, BINS) < 1e-4
    if scale < 1:
        assert min(ks_uniform_pvalue(u), chi2_uniform_pvalue(u, BINS)) > 0.01


def test_top_token_pvalue_is_the_exact_poisson_binomial_tail():
    """Two positions with top-token probabilities 0.5 and 0.9: P(X = 0, 1, 2) = 0.05, 0.5,
    0.45; both drawn gives p = 2·P(X ≥ 2) = 0.9, neither 2·P(X ≤ 0) = 0.1."""
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.05, 0.9, 0.05]]))
    assert top_token_pvalue(logp, torch.tensor([0, 1])) == pytest.approx(0.9)
    assert top_token_pvalue(logp, torch.tensor([2, 0])) == pytest.approx(0.1)
    assert top_token_pvalue(logp, torch.tensor([0, 2])) == pytest.approx(1.0)


def test_the_poisson_binomial_distribution_matches_its_recursion():
    """Against the definition, one Bernoulli at a time (P_k ← P_k (1 − q) + P_{k−1} q), over
    peaked, flat and certain positions."""
    from conformance.sampler_stats import _poisson_binomial_pmf

    gen = torch.Generator().manual_seed(5)
    q = torch.cat([torch.rand(300, generator=gen), torch.full((40,), 0.99), torch.ones(3)])
    q = q.to(torch.float64)
    pmf = [1.0]
    for p in q.tolist():
        pmf = [a * (1 - p) + b * p for a, b in zip([*pmf, 0.0], [0.0, *pmf], strict=True)]
    assert _poisson_binomial_pmf(q).tolist() == pytest.approx(pmf, abs=1e-13)
