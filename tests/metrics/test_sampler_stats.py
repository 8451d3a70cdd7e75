"""The sampler-fidelity statistics: the randomized PIT is uniform exactly when tokens are drawn
from the stated distribution, and the p-values match their reference distributions."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from conformance.sampler_stats import (
    chi2_uniform_pvalue,
    fidelity_pvalue,
    ks_uniform_pvalue,
    logp_score,
    logp_sum_tails,
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


# -- the log-prob score ---------------------------------------------------------------------


def _tempered(logp: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.log_softmax(logp * beta, -1)


def test_the_log_prob_score_of_faithful_samples_is_standard_normal(logits):
    """300 runs of exact draws from ``p`` (peaked and flat positions, ties): Z's mean within
    4 standard errors of 0 and its variance within 4 of 1 (a variance over T trials has
    standard error √(2/T)), and the p-values uniform by KS at 1e-3."""
    logp = torch.log_softmax(logits[:1000], -1)
    trials = 300
    scores = [logp_score(logp, _draw(logits[:1000], 1000 + seed)[0]) for seed in range(trials)]
    z = torch.tensor([s.z for s in scores], dtype=torch.float64)
    assert abs(float(z.mean())) < 4 / math.sqrt(trials)
    assert abs(float(z.var()) - 1) < 4 * math.sqrt(2 / trials)
    assert ks_uniform_pvalue(torch.tensor([s.p_value for s in scores])) > 1e-3
    assert abs(statistics.fmean(s.power for s in scores) - 1) < 0.05


def test_the_saddlepoint_tails_match_the_sum_s_distribution_where_the_normal_does_not():
    """One token at 0.99 at every position of 2,048 (one spec's draws): a rare draw reads many
    nats, so ``Σ S`` is skewed and its lower tail at z = −3 holds twice what the normal gives.
    Against 50,000 sums drawn exactly, the saddlepoint tails at z = −3 and +2.5 (about 0.003
    each: ~150 sums, the count's relative standard error 8 %) agree within 25 %, three of those
    standard errors."""
    logp = torch.log_softmax(_peaked(0.99, vocab=64), -1).to(torch.float64)
    gen = torch.Generator().manual_seed(17)
    sums = torch.zeros(50_000, dtype=torch.float64)
    for row in logp:
        sums += row[torch.multinomial(row.exp(), sums.numel(), True, generator=gen)]
    p = logp.exp()
    mean = float((p * logp).sum())
    sd = math.sqrt(float((p * (logp - (p * logp).sum(-1, True)) ** 2).sum()))
    lower, _, _ = logp_sum_tails(logp, mean - 3.0 * sd)
    _, upper, _ = logp_sum_tails(logp, mean + 2.5 * sd)
    seen_lower = float((sums <= mean - 3.0 * sd).double().mean())
    seen_upper = float((sums >= mean + 2.5 * sd).double().mean())
    assert lower == pytest.approx(seen_lower, rel=0.25)
    assert upper == pytest.approx(seen_upper, rel=0.25)
    # the normal's lower tail at −3 is 1.35e-3: under two thirds of what the sums show
    assert 0.5 * math.erfc(3.0 / math.sqrt(2)) < seen_lower / 1.5


@pytest.mark.parametrize("beta", [1.1, 0.9])
def test_a_tempered_sampler_moves_the_score_its_way(logits, beta):
    """Draws from ``p^β`` renormalised: sharper (β > 1) reads z > 0, flatter z < 0, both far
    past a per-spec bound, and the tempering estimate lands near β."""
    logp = torch.log_softmax(logits, -1)
    tokens, _ = _draw(torch.log_softmax(logits, -1) * beta, 3)
    score = logp_score(logp, tokens)
    assert score.p_value < 1e-5
    assert (score.z > 0) == (beta > 1)
    assert score.power == pytest.approx(beta, abs=0.05)


def test_a_sampler_off_by_tv_005_inside_the_support_is_found_where_ks_is_not_sure():
    """Flat distributions cut to their top 20 (a top-k spec), 2,048 draws from the stated
    distribution sharpened to total variation 0.05 at every position (SharpenedSampler's q):
    the score reads z ≈ 2·0.05·√2048·σ/MAD ≥ 4.5 and p < 3.6e-5, the suite's share; KS's
    √n·D ≈ √2048·0.05 = 2.3 reads p ≈ 0.01 to 1e-4 only."""
    from support.engines import _sharpened

    gen = torch.Generator().manual_seed(23)
    logp = torch.log_softmax(torch.randn(2048, 256, generator=gen), -1)
    kept = logp.topk(20).indices
    stated = torch.full_like(logp, -math.inf).scatter(-1, kept, logp.gather(-1, kept))
    stated = torch.log_softmax(stated, -1)
    q = _sharpened(stated, 0.05)
    assert float((q.exp() - stated.exp()).abs().sum(-1).mean()) / 2 == pytest.approx(0.05, 1e-6)
    tokens, noise = _draw(q, 29)
    score = logp_score(stated, tokens)
    assert score.z > 4 and score.p_value < 3.6e-5
    assert ks_uniform_pvalue(randomized_pit(stated, tokens, noise)) > score.p_value


def test_tokens_outside_the_support_and_certain_positions_are_left_out():
    logp = torch.log(torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]))
    # the first position is certain (no spread), the third's token has no mass: one position
    # with S = log 0.5 = E, z = 0
    score = logp_score(logp, torch.tensor([0, 1, 1]))
    assert score.z == pytest.approx(0.0) and score.p_value == pytest.approx(1.0)
    assert logp_score(logp[:1], torch.tensor([0])) == (0.0, 1.0, 1.0)


def test_the_tails_near_the_mean_are_the_normal_s_and_continuous(logits):
    """Rows renormalised in float32 (each sums to 1 ± 1e-7) over 4,000 positions: a sum at the
    mean reads tails of 1/2 (before float64 renormalisation and the normal inside one standard
    deviation, a sound run's sum 0.01 σ from its mean read p = 0), and the tails do not jump
    where the saddlepoint takes over at |z| = 1."""
    logp = torch.log_softmax(logits, -1)
    lp = logp.to(torch.float64)
    mean = float((lp.exp() * lp).sum())
    sd = math.sqrt(float((lp.exp() * (lp - (lp.exp() * lp).sum(-1, True)) ** 2).sum()))
    for z in (-0.01, 0.01):
        lower, upper, _ = logp_sum_tails(logp, mean + z * sd)
        assert lower + upper == pytest.approx(1.0) and upper == pytest.approx(0.5, abs=0.01)
    for z in (-1.0, 1.0):
        inside = logp_sum_tails(logp, mean + 0.999 * z * sd)[:2]
        outside = logp_sum_tails(logp, mean + 1.001 * z * sd)[:2]
        assert outside == pytest.approx(inside, abs=0.01)
