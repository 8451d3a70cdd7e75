"""The training batch and its loss: alignment, formulas, shard additivity, mini-batches."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from conformance.errors import UsageError
from conformance.rl import grpo
from conformance.training import (
    COUNTS,
    Objective,
    PolicyBatch,
    policy_loss,
    response_logprobs,
    step_stats,
)


def _batch(kind: str = "token-clip", seed: int = 0, b: int = 7, **objective) -> PolicyBatch:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, 4, (b,), generator=g).tolist()
    responses = torch.randint(1, 9, (b,), generator=g).tolist()
    sequences = tuple(tuple(range(p + n)) for p, n in zip(prompts, responses, strict=True))
    width = max(responses)
    old = -torch.rand(b, width, generator=g) * 3
    return PolicyBatch(
        sequences=sequences,
        prompt_lengths=tuple(prompts),
        objective=Objective(kind, **objective),
        lr=1e-3,
        old_logprobs=None if kind == "nll" else old,
        advantages=None if kind == "nll" else torch.randn(b, generator=g),
        weights=None if kind == "nll" else torch.rand(b, width, generator=g) + 0.5,
    )


def _current(batch: PolicyBatch, seed: int = 1) -> torch.Tensor:
    """Current log-probs: the old ones moved by up to ±0.4 nats, so some ratios leave the clip."""
    g = torch.Generator().manual_seed(seed)
    base = batch.old_logprobs if batch.old_logprobs is not None else torch.zeros(batch.mask.shape)
    return (base + 0.4 * (2 * torch.rand(base.shape, generator=g) - 1)).requires_grad_()


def test_response_logprobs_pick_the_response_entries_of_a_recompute():
    # recompute entry t scores token t + 1: here entry t holds the value t + 1 of that token
    sequences = [[10, 11, 12, 13, 14], [20, 21, 22]]
    recompute = [torch.arange(1.0, len(s)) for s in sequences]
    out = response_logprobs(recompute, [2, 1])
    # sequence 0: prompt [10, 11], response tokens at positions 2, 3, 4 → entries 1, 2, 3
    assert out.tolist() == [[2.0, 3.0, 4.0], [1.0, 2.0, 0.0]]


@pytest.mark.parametrize("kind", ["token-clip", "seq-clip"])
def test_policy_loss_is_the_surrogate_over_the_batch_norm(kind):
    batch = _batch(kind, clip_low=0.1, clip_high=0.15)
    lp = _current(batch)
    loss, counts = policy_loss(lp, batch)
    mask = batch.mask
    eps = (0.1, 0.15)
    if kind == "token-clip":
        s = grpo.clipped_surrogate(
            lp, batch.old_logprobs, batch.advantages, mask, batch.weights, eps
        )
    else:
        s = grpo.gspo_surrogate(lp, batch.old_logprobs, batch.advantages, mask, eps, batch.weights)
    assert float(loss.detach()) == pytest.approx(float(s.loss.detach()), rel=1e-6)
    assert counts["tokens"] == float(mask.sum())
    assert counts["sequences"] == len(batch.sequences)
    assert counts["clip_low"] == float(s.clipped_low.sum())
    assert counts["clip_high"] == float(s.clipped_high.sum())
    assert counts["clip_low"] + counts["clip_high"] > 0
    log_r = (lp.detach() - batch.old_logprobs)[mask]
    assert counts["ratio_k3"] == pytest.approx(float((log_r.exp() - 1 - log_r).sum()), rel=1e-5)


def test_nll_is_the_mean_response_token_nll():
    batch = _batch("nll")
    lp = _current(batch)
    loss, counts = policy_loss(lp, batch)
    tokens = [float(x) for i, row in enumerate(lp.detach()) for x in row[: batch.lengths[i]]]
    assert float(loss.detach()) == pytest.approx(-sum(tokens) / len(tokens), rel=1e-6)
    assert counts["tokens"] == len(tokens) and counts["clip_low"] == 0


@pytest.mark.parametrize("kind", ["token-clip", "seq-clip", "nll"])
@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_add_up_to_the_batch_in_loss_gradient_and_counts(kind, count):
    batch = _batch(kind)
    lp = _current(batch)
    loss, counts = policy_loss(lp, batch)
    (grad,) = torch.autograd.grad(loss, lp)
    shard_loss, shard_counts, start = 0.0, dict.fromkeys(COUNTS, 0.0), 0
    shard_grads = []
    for i in range(count):
        shard = batch.shard(i, count)
        b, w = len(shard.sequences), shard.width
        part = lp.detach()[start : start + b, :w].clone().requires_grad_()
        value, c = policy_loss(part, shard)
        (g,) = torch.autograd.grad(value, part)
        shard_grads.append(torch.nn.functional.pad(g, (0, lp.shape[1] - w)))
        shard_loss += float(value.detach())
        shard_counts = {k: shard_counts[k] + c[k] for k in COUNTS}
        start += b
    assert start == len(batch.sequences)
    assert shard_loss == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    assert shard_counts == pytest.approx(counts, rel=1e-5)
    assert torch.allclose(torch.cat(shard_grads), grad, atol=1e-7)


def test_minibatches_are_contiguous_and_normalised_on_their_own():
    batch = _batch(b=8)
    parts = batch.minibatches(4)
    assert sum((p.sequences for p in parts), ()) == batch.sequences
    assert [p.loss_norm for p in parts] == [2.0] * 4
    assert all(torch.equal(p.advantages, batch.advantages[2 * i : 2 * i + 2]) for i, p in
               enumerate(parts))  # fmt: skip


def test_batch_pickles_for_worker_processes():
    batch = _batch()
    back = pickle.loads(pickle.dumps(batch))
    assert back.sequences == batch.sequences and back.loss_norm == batch.loss_norm
    assert torch.equal(back.old_logprobs, batch.old_logprobs)


def test_default_clip_ranges_follow_the_objective():
    assert Objective("token-clip").eps == (0.2, 0.2)
    assert Objective("seq-clip").eps == (3e-4, 4e-4)
    assert Objective("token-clip", clip_high=0.28).eps == (0.2, 0.28)


@pytest.mark.parametrize(
    "bad",
    [
        {"objective": Objective("token-clip")},  # no old log-probs
        {"prompt_lengths": (3,)},  # empty response
        {"prompt_lengths": (0,)},  # empty prompt
        {"old_logprobs": torch.zeros(1, 5), "advantages": torch.zeros(1)},  # wrong width
        {"old_logprobs": torch.zeros(1, 1), "advantages": torch.zeros(2)},  # one per sequence
    ],
)
def test_malformed_batches_are_refused(bad):
    fields = {"sequences": ((1, 2, 3),), "prompt_lengths": (2,), "objective": Objective("nll")}
    with pytest.raises(UsageError):
        PolicyBatch(**{**fields, "lr": 1e-3, **bad})


def test_bad_objectives_are_refused():
    for kwargs in ({"kind": "ppo"}, {"clip_low": 1.0}, {"clip_high": -0.1}):
        with pytest.raises(UsageError):
            Objective(**kwargs)


def test_step_stats_pool_counts_over_updates():
    a = {"loss": 1.0, "grad_norm": 2.0, "tokens": 10, "sequences": 2, "clip_low": 1,
         "clip_high": 0, "clip_seq": 1, "ratio_k3": 0.1}  # fmt: skip
    b = {**a, "loss": 3.0, "grad_norm": 4.0, "tokens": 30, "clip_high": 2, "clip_seq": 2}
    stats = step_stats([a, b])
    assert stats["loss"] == 2.0 and stats["grad_norm"] == 3.0 and stats["grad_norm_max"] == 4.0
    assert stats["clip_low"] == 2 / 40 and stats["clip_high"] == 2 / 40
    assert stats["clip_fraction"] == 4 / 40 and stats["clip_seq"] == 3 / 4
    assert math.isclose(stats["ratio_kl"], 0.2 / 40)
