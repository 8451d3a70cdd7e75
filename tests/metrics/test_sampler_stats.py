"""The sampler-fidelity statistics: the randomized PIT is uniform exactly when tokens are drawn
from the stated distribution, and the p-values match their reference distributions."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.sampler_stats import (
    chi2_uniform_pvalue,
    ks_uniform_pvalue,
    randomized_pit,
    uniformity_pvalue,
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
        u = randomized_pit(torch.log_softmax(logits, -1), tokens, noise)
        assert float(u.min()) >= 0.0 and float(u.max()) <= 1.0
        alarms += uniformity_pvalue(u, BINS) < 1e-3
    # 20 tests at 1e-3: an alarm here has probability 2 %, two of them 2e-4
    assert alarms <= 1


@pytest.mark.parametrize("scale", [1.1, 0.9])
def test_a_sampler_at_the_wrong_temperature_is_found(logits, scale):
    tokens, noise = _draw(logits / scale, 1)
    u = randomized_pit(torch.log_softmax(logits, -1), tokens, noise)
    assert uniformity_pvalue(u, BINS) < 1e-4
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
