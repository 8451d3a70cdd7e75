"""The stated sampler (``conformance.sampling``): its support is transformers' warpers' in the
stated order, the joint order differs from it where the nucleus of the whole distribution is
wider than the top k, and ``outside_support`` calls a token outside exactly when no engine
within the margin could have drawn it."""

from __future__ import annotations

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from conformance.sampling import SamplerOrder, outside_support, truncate

SPECS = [(1.0, 5, 1.0), (1.0, 0, 0.7), (0.7, 20, 0.8), (1.3, 20, 0.9), (0.5, 20, 0.5)]


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, -1)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SPECS)
def test_the_stated_support_is_transformers_warpers_support(temperature, top_k, top_p):
    logits = torch.randn(64, 384, generator=torch.Generator().manual_seed(0)) * 3
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1.0:
        warped = TopPLogitsWarper(top_p)(None, warped)

    kept = truncate(_tempered(logits, temperature), top_k, top_p)

    assert torch.equal(torch.isfinite(kept), torch.isfinite(warped))


def test_the_joint_order_keeps_the_top_k_when_the_whole_nucleus_is_wider():
    # four tokens of 0.3, 0.3, 0.2, 0.2: the top 3 renormalised are 3/8, 3/8, 2/8, whose 0.7
    # nucleus is the first two (mass above the third 6/8 ≥ 0.7); the whole one's 0.7 nucleus is
    # the first three (mass above the third 0.6 < 0.7), which top-3 keeps whole
    logp = torch.tensor([[0.3, 0.3, 0.2, 0.2]]).log()

    stated = torch.isfinite(truncate(logp, 3, 0.7))
    joint = torch.isfinite(truncate(logp, 3, 0.7, SamplerOrder.JOINT))

    assert stated.tolist() == [[True, True, False, False]]
    assert joint.tolist() == [[True, True, True, False]]


@pytest.mark.parametrize("order", list(SamplerOrder))
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SPECS)
def test_outside_support_without_margin_is_the_truncated_support(order, temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(1)
    logp = _tempered(torch.randn(256, 384, generator=generator) * 3, temperature)
    # tokens from the whole vocabulary: most outside a narrow support, some in
    tokens = torch.randint(0, 384, (256,), generator=generator)
    tokens[::4] = logp[::4].argmax(-1)

    outside = outside_support(
        logp, tokens, temperature=temperature, top_k=top_k, top_p=top_p, order=order, slack=0.0
    )

    cut = torch.isinf(truncate(logp, top_k, top_p, order).gather(-1, tokens[:, None])).squeeze(-1)
    assert torch.equal(outside, cut)
    assert 0 < int(outside.sum()) < len(tokens)


def test_a_token_within_the_margin_of_the_top_k_boundary_is_inside():
    # the second token trails the first by 1e-4 nats: top-1 cuts it, unless the engine's
    # log-probs may be 1e-4 off (its sampler may have ranked it first)
    logp = torch.log_softmax(torch.tensor([[1.0, 1.0 - 1e-4, -5.0]]), -1)
    second = torch.tensor([1])

    def out(margin: float) -> bool:
        return bool(outside_support(logp, second, temperature=1.0, top_k=1, top_p=1.0,
                                    margin=margin))  # fmt: skip

    assert out(0.0) and out(4e-5) and not out(6e-5)


def test_a_tie_at_the_top_k_boundary_is_inside():
    logp = torch.log_softmax(torch.tensor([[2.0, 1.0, 1.0, 0.0]]), -1)
    both = torch.tensor([1, 2])

    outside = outside_support(logp.expand(2, 4), both, temperature=1.0, top_k=2, top_p=1.0)

    assert not outside.any()
