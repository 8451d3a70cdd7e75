"""The Backend training protocol on the ``hf`` backend: it trains, deterministically, and hands
out weights the engine takes."""

from __future__ import annotations

import itertools

import pytest
import torch

from conformance.backends import BACKENDS, Backend, BackendConfig
from conformance.engines import ENGINES, EngineConfig
from conformance.errors import UsageError
from conformance.rl.loop import RunConfig, run_smoke, trained
from conformance.training import Objective, PolicyBatch

PROMPT = 3


def _fresh(model) -> Backend:
    torch.set_num_threads(1)
    return BACKENDS.get("hf")(BackendConfig(model=model))


def _policy_batch(backend: Backend, lr: float = 3e-3, **objective) -> PolicyBatch:
    g = torch.Generator().manual_seed(0)
    sequences = tuple(
        tuple(torch.randint(3, 300, (PROMPT + n,), generator=g).tolist()) for n in (4, 9, 6, 2)
    )
    lp = backend.recompute(sequences).logprobs
    old = torch.nn.utils.rnn.pad_sequence([x[PROMPT - 1 :] for x in lp], batch_first=True)
    return PolicyBatch(
        sequences=sequences,
        prompt_lengths=(PROMPT,) * len(sequences),
        objective=Objective("token-clip", **objective),
        lr=lr,
        old_logprobs=old,
        advantages=torch.tensor([1.0, -0.5, 0.8, -1.3]),
    )


def test_updates_on_a_fixed_batch_lower_its_loss_until_the_clip_holds_them(default_model):
    backend = _fresh(default_model)
    batch = _policy_batch(backend, lr=1e-5)
    results = [backend.update(batch) for _ in range(8)]
    losses = [r["loss"] for r in results]
    assert results[0]["clip_low"] == results[0]["clip_high"] == 0  # on-policy: ratio = 1
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert results[-1]["clip_low"] + results[-1]["clip_high"] > 0  # off-policy now: clipped
    # the clipped objective cannot pass mean_i A_i (1 + ε) for A_i > 0, A_i (1 − ε) for A_i < 0
    adv = batch.advantages
    bound = -float(torch.where(adv > 0, 1.2 * adv, 0.8 * adv).mean())
    assert min(losses) >= bound - 1e-6
    assert all(r["grad_norm"] > 0 for r in results)


def test_nll_updates_lower_the_nll(default_model):
    backend = _fresh(default_model)
    batch = _policy_batch(backend)
    nll = PolicyBatch(batch.sequences, batch.prompt_lengths, Objective("nll"), lr=1e-3)
    losses = [backend.update(nll)["loss"] for _ in range(5)]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses


def test_the_same_updates_on_two_fresh_backends_give_bitwise_equal_weights(default_model):
    states = []
    for _ in range(2):
        backend = _fresh(default_model)
        batch = _policy_batch(backend, clip_high=0.28)
        for minibatch in batch.minibatches(2) * 2:
            backend.update(minibatch)
        states.append(backend.state_dict())
    first, second = states
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    start = _fresh(default_model).state_dict()
    assert any(not torch.equal(first[k], start[k]) for k in first)  # it did train


def test_state_dict_is_a_cpu_copy_the_engine_takes(default_model):
    backend = _fresh(default_model)
    batch = _policy_batch(backend)
    before = backend.state_dict()
    backend.update(batch)
    after = backend.state_dict()
    assert all(t.device.type == "cpu" for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the copy did not move
    engine = ENGINES.get("hf-generate")(EngineConfig(model=default_model))
    engine.load_weights(after)
    scored = engine.score([list(batch.sequences[1])])[0]
    recomputed = backend.recompute([batch.sequences[1]]).logprobs[0].tolist()
    assert scored == pytest.approx(recomputed, abs=1e-5)


def test_reset_optimizer_restarts_adam(default_model):
    """Adam's first step moves every weight by ≈ lr (m/√v = ±1): after a reset, again."""
    backend = _fresh(default_model)
    batch = _policy_batch(backend, lr=1e-4)
    steps = []
    for reset in (False, False, True):
        if reset:
            backend.reset_optimizer()
        before = backend.state_dict()["lm_head.weight"]
        backend.update(batch)
        steps.append(float((backend.state_dict()["lm_head.weight"] - before).abs().max()))
    assert steps[0] == pytest.approx(1e-4, rel=0.01)
    assert steps[2] == pytest.approx(1e-4, rel=0.01)


def test_a_backend_that_cannot_train_is_refused(default_model, tmp_path):
    class ScoreOnly(Backend):
        name = "score-only"

        def recompute(self, sequences, *, temperature=1.0, grad=False):
            raise AssertionError("not reached")

    backend = ScoreOnly(BackendConfig(model=default_model))
    with pytest.raises(UsageError, match="cannot train"):
        trained(backend.update, None)
    with pytest.raises(UsageError, match="cannot hand out its weights"):
        trained(backend.state_dict)
    engine = ENGINES.get("hf-generate")(EngineConfig(model=default_model))
    with pytest.raises(UsageError, match=r"cannot train.*a backend that can train"):
        run_smoke(engine, backend, RunConfig(steps=1), tmp_path)
