"""The stated sampler (``conformance.sampling``): its support is transformers' warpers' in the
stated order (min-p first, as vLLM applies it), transformers' own order puts min-p last, the
joint order differs from the stated one where the nucleus of the whole distribution is wider
than the top k, and ``outside_support`` calls a token outside exactly when no engine within the
margin could have drawn it."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from conformance.sampling import SamplerOrder, outside_support, truncate

#: (temperature, top_k, top_p, min_p)
SPECS = [
    (1.0, 5, 1.0, 0.0),
    (1.0, 0, 0.7, 0.0),
    (0.7, 20, 0.8, 0.0),
    (1.3, 20, 0.9, 0.0),
    (0.5, 20, 0.5, 0.0),
    (1.0, 20, 0.9, 0.1),
    (0.7, 0, 0.8, 0.2),
    (1.3, 20, 1.0, 0.05),
]


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, -1)


def _warped(logits: torch.Tensor, spec: tuple[float, int, float, float], *, min_p_first: bool):
    temperature, top_k, top_p, min_p = spec
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())
    min_p_warper = MinPLogitsWarper(min_p) if min_p else None
    if min_p_warper and min_p_first:
        warped = min_p_warper(None, warped)
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1.0:
        warped = TopPLogitsWarper(top_p)(None, warped)
    if min_p_warper and not min_p_first:
        warped = min_p_warper(None, warped)
    return warped


@pytest.mark.parametrize("spec", SPECS)
def test_the_stated_support_is_the_warpers_support_min_p_first(spec):
    """Min-p first is vLLM's order (``MinPLogitsProcessor`` before ``TopKTopPSampler``), and
    its min-p is transformers' formula (``p < min_p · p_max`` is cut)."""
    logits = torch.randn(64, 384, generator=torch.Generator().manual_seed(0)) * 3
    temperature, top_k, top_p, min_p = spec

    kept = truncate(_tempered(logits, temperature), top_k, top_p, min_p=min_p)

    warped = _warped(logits, spec, min_p_first=True)
    assert torch.equal(torch.isfinite(kept), torch.isfinite(warped))


@pytest.mark.parametrize("spec", SPECS)
def test_min_p_last_is_transformers_generate_order(spec):
    logits = torch.randn(64, 384, generator=torch.Generator().manual_seed(0)) * 3
    temperature, top_k, top_p, min_p = spec

    kept = truncate(
        _tempered(logits, temperature), top_k, top_p, SamplerOrder.MIN_P_LAST, min_p=min_p
    )

    warped = _warped(logits, spec, min_p_first=False)
    assert torch.equal(torch.isfinite(kept), torch.isfinite(warped))


def test_min_p_first_narrows_the_nucleus():
    # 0.4, 0.3, 0.2, 0.1: min-p 0.3 cuts 0.1 (< 0.12); top-p 0.75 over the rest (4/9, 3/9, 2/9)
    # keeps two (mass above the third 7/9 ≥ 0.75), over the whole three (0.7 < 0.75)
    logp = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()

    first = torch.isfinite(truncate(logp, 0, 0.75, min_p=0.3))
    last = torch.isfinite(truncate(logp, 0, 0.75, SamplerOrder.MIN_P_LAST, min_p=0.3))

    assert first.tolist() == [[True, True, False, False]]
    assert last.tolist() == [[True, True, True, False]]


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
@pytest.mark.parametrize("spec", SPECS)
def test_outside_support_without_margin_is_the_truncated_support(order, spec):
    temperature, top_k, top_p, min_p = spec
    generator = torch.Generator().manual_seed(1)
    logp = _tempered(torch.randn(256, 384, generator=generator) * 3, temperature)
    # tokens from the whole vocabulary: most outside a narrow support, some in
    tokens = torch.randint(0, 384, (256,), generator=generator)
    tokens[::4] = logp[::4].argmax(-1)

    outside = outside_support(
        logp, tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        order=order, slack=0.0,
    )  # fmt: skip

    kept = truncate(logp, top_k, top_p, order, min_p=min_p)
    cut = torch.isinf(kept.gather(-1, tokens[:, None])).squeeze(-1)
    assert torch.equal(outside, cut)
    assert 0 < int(outside.sum()) < len(tokens)


def test_a_token_within_the_margin_of_the_min_p_boundary_is_inside():
    # the second token's probability is 1e-4 nats short of min-p 0.5 of the first's
    logp = torch.log_softmax(torch.tensor([[0.0, math.log(0.5) - 1e-4, -5.0]]), -1)
    second = torch.tensor([1])

    def out(margin: float) -> bool:
        return bool(outside_support(logp, second, temperature=1.0, top_k=0, top_p=1.0,
                                    min_p=0.5, margin=margin))  # fmt: skip

    assert out(0.0) and out(4e-5) and not out(6e-5)


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
