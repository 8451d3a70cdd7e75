"""GRPO math and remedies against their formulas, evaluated independently (loops, autograd)."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.errors import UsageError
from conformance.rl import grpo


def _batch(seed: int = 0, b: int = 6, t: int = 5):
    g = torch.Generator().manual_seed(seed)
    lp_old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    lp_infer = lp_old + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    return lp_old, lp_infer, mask, adv


def test_group_advantages_are_zscores_per_group():
    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.2, 0.2, 0.2, 0.2]], dtype=torch.float64)
    adv = grpo.group_advantages(rewards)
    for row, out in zip(rewards.tolist(), adv.tolist(), strict=True):
        mean = sum(row) / len(row)
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / (len(row) - 1))
        assert out == pytest.approx([(r - mean) / (std + 1e-6) for r in row])
    assert adv[1].abs().max() == 0  # equal rewards carry no signal


def test_group_advantages_rejects_singleton_groups():
    with pytest.raises(UsageError):
        grpo.group_advantages(torch.ones(3, 1))


@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)])
def test_surrogate_matches_per_token_formula_and_its_gradient(eps):
    lp_old, _, mask, adv = _batch()
    g = torch.Generator().manual_seed(1)
    lp = (
        lp_old + 0.3 * torch.randn(lp_old.shape, generator=g, dtype=torch.float64)
    ).requires_grad_()
    out = grpo.clipped_surrogate(lp, lp_old, adv, mask, eps=eps)
    low, high = 1 - eps[0], 1 + eps[1]
    for i in range(lp.shape[0]):
        n = int(mask[i].sum())
        seq = 0.0
        for t in range(lp.shape[1]):
            r = math.exp(float(lp[i, t].detach() - lp_old[i, t]))
            a = float(adv[i])
            if t < n:
                seq += min(r * a, min(max(r, low), high) * a)
            # the clip acts (zero gradient) only where min() picks the clipped term
            assert bool(out.clipped_low[i, t]) == (t < n and r < low and a < 0)
            assert bool(out.clipped_high[i, t]) == (t < n and r > high and a > 0)
        assert float(out.per_sequence[i].detach()) == pytest.approx(seq / n)
    assert bool((out.clipped_low | out.clipped_high).any())  # the example exercises the clip
    out.loss.backward()
    assert lp.grad[~mask].abs().max() == 0  # padding never trains
    cut = out.clipped_low | out.clipped_high
    assert lp.grad[cut].abs().max() == 0  # clipped tokens carry no gradient
    assert lp.grad[mask & ~cut].abs().min() > 0


def test_on_policy_surrogate_gradient_is_advantage_weighted_score():
    """At r = 1 no token is clipped and d loss / d lp_{i,t} = −A_i / (G |o_i|)."""
    lp_old, _, mask, adv = _batch(2)
    lp = lp_old.clone().requires_grad_()
    out = grpo.clipped_surrogate(lp, lp_old, adv, mask)
    out.loss.backward()
    expected = -adv[:, None] / (mask.sum(1, keepdim=True) * lp.shape[0]) * mask
    assert torch.allclose(lp.grad, expected)
    assert not (out.clipped_low | out.clipped_high).any()


def test_weights_scale_each_tokens_term():
    lp_old, _, mask, adv = _batch(3)
    w = torch.full_like(lp_old, 2.5)
    plain = grpo.clipped_surrogate(lp_old, lp_old, adv, mask)
    weighted = grpo.clipped_surrogate(lp_old, lp_old, adv, mask, w)
    assert float(weighted.loss) == pytest.approx(2.5 * float(plain.loss))


def test_gspo_clips_one_geometric_mean_ratio_per_sequence():
    lp_old, lp_infer, mask, adv = _batch(4)
    lp = lp_old.clone().requires_grad_()
    out = grpo.gspo_surrogate(lp, lp_infer, adv, mask)
    lo, hi = 1 - grpo.GSPO_EPS[0], 1 + grpo.GSPO_EPS[1]
    for i in range(lp.shape[0]):
        n = int(mask[i].sum())
        s = math.exp(float((lp_old[i, :n] - lp_infer[i, :n]).mean()))
        a = float(adv[i])
        assert float(out.per_sequence[i].detach()) == pytest.approx(
            min(s * a, min(max(s, lo), hi) * a)
        )
        # a clipped sequence has every one of its tokens cut, and no padding
        assert out.clipped_low[i].tolist() == [t < n and s < lo and a < 0 for t in range(5)]
        assert out.clipped_high[i].tolist() == [t < n and s > hi and a > 0 for t in range(5)]
    assert bool((out.clipped_low | out.clipped_high).any())


def test_gspo_token_gradient_is_gspos_and_weights_scale_each_tokens_term():
    """Unweighted, d/dlp of min(s_i A, clip(s_i) A) with s_i = exp(mean_t(lp − lp_old)) (GSPO
    itself, differentiated by autograd); weighted, each token's gradient scales by its w."""
    lp_old, _, mask, adv = _batch(6)
    g = torch.Generator().manual_seed(7)
    lp = (lp_old + 2e-4 * torch.randn(lp_old.shape, generator=g, dtype=torch.float64)).detach()
    eps = grpo.GSPO_EPS
    x = lp.clone().requires_grad_()
    n = mask.sum(1)
    s = torch.exp((torch.where(mask, x - lp_old, 0)).sum(1) / n)
    reference = torch.minimum(s * adv, torch.clamp(s, 1 - eps[0], 1 + eps[1]) * adv).mean()
    (expected,) = torch.autograd.grad(-reference, x)
    y = lp.clone().requires_grad_()
    (got,) = torch.autograd.grad(grpo.gspo_surrogate(y, lp_old, adv, mask).loss, y)
    assert torch.allclose(got, expected)
    assert expected.abs().max() > 0 and (expected == 0).any()  # some sequences clipped, some not
    w = torch.rand(lp.shape, generator=g, dtype=torch.float64) + 0.5
    z = lp.clone().requires_grad_()
    (weighted,) = torch.autograd.grad(grpo.gspo_surrogate(z, lp_old, adv, mask, eps, w).loss, z)
    assert torch.allclose(weighted, w * expected)


def test_remedy_weights_follow_their_definitions():
    lp_old, lp_infer, mask, _ = _batch(5)
    rho = torch.exp(lp_old - lp_infer)
    tis = grpo.remedy_weights("tis", lp_old, lp_infer, mask)
    mis = grpo.remedy_weights("mis", lp_old, lp_infer, mask)
    ice = grpo.remedy_weights("icepop", lp_old, lp_infer, mask)
    seq = grpo.remedy_weights("seq-mis", lp_old, lp_infer, mask)
    for i, t in mask.nonzero().tolist():
        r = float(rho[i, t])
        assert float(tis[i, t]) == pytest.approx(min(r, 2.0))
        assert float(mis[i, t]) == pytest.approx(r if r <= 2.0 else 0.0)
        assert float(ice[i, t]) == pytest.approx(r if 0.5 <= r <= 5.0 else 0.0)
        n = int(mask[i].sum())
        r_seq = math.prod(float(x) for x in rho[i, :n])
        assert float(seq[i, t]) == pytest.approx(r_seq if r_seq <= 3.0 else 0.0)
    assert grpo.remedy_weights("none", lp_old, lp_infer, mask) is None


def test_rho_is_one_on_padding_even_with_infinite_logprobs():
    lp_old = torch.tensor([[-1.0, -math.inf]])
    lp_infer = torch.tensor([[-1.5, -math.inf]])
    mask = torch.tensor([[True, False]])
    rho = grpo.rho(lp_old, lp_infer, mask)
    assert rho[0].tolist() == pytest.approx([math.exp(0.5), 1.0])


def test_biased_weights_eq18_and_hacking_signal_eq23():
    p_old = torch.tensor([[0.05, 0.5, 0.09], [0.2, 0.01, 0.99]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    phi = grpo.biased_weights(p_old, 3.0)
    assert phi.tolist() == [[3.0, 1.0, 3.0], [1.0, 3.0, 1.0]]
    adv = torch.tensor([0.5, -2.0])
    # J = Σ Â (φ − 1) with δ = 2: row 0 has two low-prob tokens, row 1 one valid low-prob token
    assert grpo.hacking_signal(adv, p_old, mask) == pytest.approx(0.5 * 2 + (-2.0) * 1)


def test_unbiased_weights_have_mean_one_and_std_sigma():
    g = torch.Generator().manual_seed(0)
    xi = grpo.unbiased_weights(torch.Size([200, 100]), 0.2, g)
    assert float(xi.mean()) == pytest.approx(1.0, abs=4 * 0.2 / math.sqrt(xi.numel()))
    assert float(xi.std()) == pytest.approx(0.2, rel=0.05)
