"""Scenarios: when they act and what they do to weights, LR and token weights."""

from __future__ import annotations

import pytest
import torch

from conformance.errors import UsageError
from conformance.rl.scenarios import Scenario, perturbed


def test_level_is_off_before_at_and_ramps_linearly():
    s = Scenario("inject", at=4, ramp=4)
    assert [s.level(t) for t in range(10)] == [0, 0, 0, 0, 0.25, 0.5, 0.75, 1, 1, 1]
    assert Scenario("natural").level(100) == 0.0


def test_lr_jump_multiplies_from_at():
    s = Scenario("lr-jump", at=3, strength=7.0)
    assert [s.lr_factor(t) for t in range(5)] == [1, 1, 1, 7.0, 7.0]


def test_exact_hands_back_the_trainers_own_logprobs():
    lp_old, lp_infer = torch.tensor([-1.0]), torch.tensor([-1.1])
    assert Scenario("exact").rollout_logprobs(0, lp_infer, lp_old) is lp_old
    assert Scenario("natural").rollout_logprobs(0, lp_infer, lp_old) is lp_infer


def test_engine_bias_divides_the_low_probability_tokens_probabilities_from_at():
    p_infer = torch.tensor([0.5, 0.09, 0.11, 0.01])
    lp_infer = p_infer.log()
    s = Scenario("engine-bias", at=2, strength=4.0)
    assert s.rollout_logprobs(1, lp_infer, lp_infer) is lp_infer  # before at: the engine's own
    reported = s.rollout_logprobs(2, lp_infer, lp_infer).exp()
    assert reported.tolist() == pytest.approx([0.5, 0.09 / 4, 0.11, 0.01 / 4])


def test_inject_perturbs_engine_weights_by_the_chosen_relative_size():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(400, 400, generator=g)
    state = {"w": w, "ids": torch.arange(3)}
    s = Scenario("inject", at=2, strength=0.05)
    assert s.engine_weights(0, state, g) is state  # the weights after step 0 serve step 1 < at
    out = s.engine_weights(1, state, g)
    noise = out["w"] - w
    assert float(noise.std() / w.pow(2).mean().sqrt()) == pytest.approx(0.05, rel=0.02)
    assert torch.equal(out["ids"], state["ids"])


def test_perturbed_keeps_dtype():
    t = torch.ones(8, dtype=torch.bfloat16)
    assert perturbed(t, 0.1, torch.Generator().manual_seed(0)).dtype == torch.bfloat16


def test_biased_and_unbiased_weights_switch_on_at_at():
    g = torch.Generator().manual_seed(0)
    p_old = torch.tensor([[0.05, 0.5]])
    biased = Scenario("biased", at=1, strength=3.0)
    assert biased.token_weights(0, p_old, g) is None
    assert biased.token_weights(1, p_old, g).tolist() == [[3.0, 1.0]]
    assert Scenario("unbiased").token_weights(0, p_old, g).shape == p_old.shape
    assert Scenario("natural").token_weights(0, p_old, g) is None


@pytest.mark.parametrize(
    "kwargs", [{"name": "bogus"}, {"name": "inject", "at": -1}, {"name": "lr-jump", "strength": -2}]
)
def test_bad_scenarios_are_refused(kwargs):
    with pytest.raises(UsageError):
        Scenario(**kwargs)
