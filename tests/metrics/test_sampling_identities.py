"""Identities the metrics must satisfy on exact samples (objective-level hacking Eq. 30, 46).

π_train and π_infer are two known distributions over a small vocabulary; tokens are drawn
from one of them and scored under both, as a rollout engine and a trainer would. Sample means
must then sit within a CLT bound (5 standard errors, estimated from the same sample) of the
exact expectations computed from the distributions.
"""

from __future__ import annotations

import math

import pytest
import torch

from conformance.metrics import mismatch_metrics

VOCAB = 64
SAMPLES = 200_000
Z = 5.0  # standard errors: a false failure has probability ~6e-7


@pytest.fixture(scope="module")
def distributions() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(30)
    logits = torch.randn(VOCAB, generator=gen, dtype=torch.float64) * 2
    log_train = torch.log_softmax(logits, -1)
    log_infer = torch.log_softmax(logits + 0.3 * torch.randn(VOCAB, generator=gen), -1)
    return log_train, log_infer


def scored_sample(
    draw_from: torch.Tensor, log_train: torch.Tensor, log_infer: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(draw_from.exp(), SAMPLES, replacement=True, generator=gen)
    shape = (SAMPLES // 100, 100)
    mask = torch.ones(shape, dtype=torch.bool)
    return log_train[tokens].reshape(shape), log_infer[tokens].reshape(shape), mask


def within_clt(metrics: dict[str, float], expected: float) -> bool:
    return abs(metrics["rho_mean"] - expected) <= Z * metrics["rho_std"] / math.sqrt(SAMPLES)


def test_inverse_weight_has_mean_one_under_pi_train(distributions) -> None:
    """Eq. 30: E_{o∼π_train}[1/ρ] = Σ π_infer = 1."""
    log_train, log_infer = distributions
    lp_train, lp_infer, mask = scored_sample(log_train, log_train, log_infer, seed=1)
    inverse = mismatch_metrics(lp_infer, lp_train, mask)  # swapped sides: its ρ is 1/ρ
    assert inverse["rho_std"] > 0.05  # the identity is not trivially true here
    assert within_clt(inverse, 1.0)


def test_inverse_weight_is_biased_up_under_pi_infer(distributions) -> None:
    """Eq. 46 (survival bias): E_{o∼π_infer}[1/ρ] = Σ π_infer²/π_train ≥ 1."""
    log_train, log_infer = distributions
    lp_train, lp_infer, mask = scored_sample(log_infer, log_train, log_infer, seed=2)
    inverse = mismatch_metrics(lp_infer, lp_train, mask)
    exact = float((2 * log_infer - log_train).exp().sum())
    assert exact > 1.0
    assert within_clt(inverse, exact)
    assert inverse["rho_mean"] - Z * inverse["rho_std"] / math.sqrt(SAMPLES) > 1.0


def test_weight_has_mean_one_and_k_estimators_estimate_kl_under_pi_infer(distributions) -> None:
    """On rollout tokens (o ∼ π_infer): E[ρ] = 1; k1, k3 are unbiased for KL(π_infer‖π_train)."""
    log_train, log_infer = distributions
    lp_train, lp_infer, mask = scored_sample(log_infer, log_train, log_infer, seed=3)
    got = mismatch_metrics(lp_train, lp_infer, mask)
    assert within_clt(got, 1.0)
    kl = float((log_infer.exp() * (log_infer - log_train)).sum())
    log_r = (lp_train - lp_infer).flatten()
    for key, per_token in (("k1", -log_r), ("k3", log_r.exp() - 1 - log_r)):
        stderr = float(per_token.std()) / math.sqrt(SAMPLES)
        assert abs(got[key] - kl) <= Z * stderr, key
    # χ²: E_{π_infer}[ρ²] − 1 = Σ π_train²/π_infer − 1
    chi2 = float((2 * log_train - log_infer).exp().sum()) - 1
    stderr = float(log_r.exp().square().std()) / math.sqrt(SAMPLES)
    assert abs(got["chi2_token"] - chi2) <= Z * stderr
