"""The backend's processed distribution is the one a sampler draws from (transformers' warpers)."""

from __future__ import annotations

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from conformance.hf_model import gather_logprobs


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 0, 0.9), (1.3, 20, 1.0), (0.5, 20, 0.8), (1.0, 1, 1.0)],
)
def test_matches_transformers_warpers(temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 384, generator=generator) * 3
    targets = torch.arange(6)
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1.0:
        warped = TopPLogitsWarper(top_p)(None, warped)
    expected = torch.log_softmax(warped, -1).gather(-1, targets[:, None]).squeeze(-1)

    picked, entropy = gather_logprobs(logits, targets, temperature, top_k, top_p)

    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(picked))
    torch.testing.assert_close(picked[finite], expected[finite], rtol=0, atol=1e-5)
    assert torch.isfinite(entropy).all() and (entropy >= 0).all()


def test_truncation_keeps_a_distribution():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    everything = torch.arange(50).expand(4, 50)
    total = torch.zeros(4)
    for column in range(50):
        lp, _ = gather_logprobs(logits, everything[:, column], 1.0, 10, 0.7)
        total += lp.exp()
    torch.testing.assert_close(total, torch.ones(4))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_batch_one_sequence_at_a_time_gives_the_whole_batchs_numbers(temperature):
    """The backend computes a batch's log-probs one sequence at a time (its memory is then one
    sequence's): bitwise the numbers the whole batch at once gives."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, 4096, generator=generator) * 3
    targets = torch.randint(0, 4096, (3, 50), generator=generator)
    logp = torch.log_softmax(logits / temperature, -1)
    whole = logp.gather(-1, targets[..., None]).squeeze(-1)
    whole_entropy = -torch.special.xlogy(logp.exp(), logp.exp()).sum(-1)

    picked, entropy = gather_logprobs(logits, targets, temperature)

    assert torch.equal(picked, whole) and torch.equal(entropy, whole_entropy)
