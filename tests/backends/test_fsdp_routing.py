"""Routing replay on the ``fsdp`` backend's FSDP2 ranks (gloo on CPU): the routes the ranks
record are the unsharded model's, and with ``routing_replay`` they route every scored position
as the engine did and score as the ``hf`` backend replaying the same routes does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance.backends import BACKENDS, BackendConfig
from conformance.engines.base import EngineConfig, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.errors import UsageError
from conformance.models import cached_model
from conformance.routing import agreeing

pytestmark = pytest.mark.fsdp

#: eight prompts of different lengths, so the ranks' shares and micro-batches are uneven
PROMPTS = [list(range(5 + i, 5 + i + n)) for i, n in enumerate((3, 7, 12, 5, 9, 4, 15, 6))]
SPEC = SamplingSpec(max_new_tokens=64, seed=0)
#: three sequences a micro-batch: each rank's share of four runs as two micro-batches
MICRO = 3


def backend(name: str, model: Path, **config) -> object:
    options = config.pop("options", {})
    return BACKENDS.get(name)(BackendConfig(model=model, options=options, **config))


@pytest.fixture(scope="module")
def moe_model() -> Path:
    """The zoo's MoE model (``make_model(dir, arch="qwen3-moe", seed=1)``), built once."""
    return cached_model(arch="qwen3-moe", seed=1, vocab=384, layers=2, hidden=64)


@pytest.fixture(scope="module")
def rollouts(moe_model):
    """bf16 rollouts of an hf-generate engine, with the routes it decoded them by."""
    engine = HFGenerateEngine(EngineConfig(model=moe_model, dtype="bfloat16"))
    try:
        completions = engine.generate(PROMPTS, SPEC)
    finally:
        engine.close()
    assert all(c.routes is not None for c in completions)
    return completions


@pytest.fixture(scope="module")
def ranks(moe_model):
    """fsdp backends at world size 2 in fp32, by replay mode; they share one group of ranks."""
    made = {
        mode: backend(
            "fsdp",
            moe_model,
            micro_batch_size=MICRO,
            options={"world_size": "2", "routing_replay": mode},
        )
        for mode in ("none", "engine-ids", "engine")
    }
    yield made
    for b in made.values():
        b.close()


def _sequences(completions) -> list[list[int]]:
    return [c.sequence for c in completions]


def test_unreplayed_ranks_route_as_the_unsharded_model(moe_model, rollouts, ranks):
    sequences = _sequences(rollouts)
    engine_routes = [c.routes for c in rollouts]
    hf = backend("hf", moe_model).recompute(sequences, routes=engine_routes)
    # routing_replay=none ignores the routes it is given
    got = ranks["none"].recompute(sequences, routes=engine_routes)
    assert got.routes is not None and hf.routes is not None
    assert len(got.routes) == len(hf.routes) == len(sequences)
    for ours, theirs, seq in zip(got.routes, hf.routes, sequences, strict=True):
        assert ours.experts.dtype == theirs.experts.dtype == torch.int64
        assert ours.experts.shape == (len(seq) - 1, 2, 2)
        assert torch.equal(ours.experts, theirs.experts)
        assert ours.weights is not None and theirs.weights is not None
        assert ours.weights.dtype == theirs.weights.dtype == torch.float32
        torch.testing.assert_close(ours.weights, theirs.weights, rtol=0, atol=1e-5)
    # the fp32 backend routes some tokens unlike the bf16 engine: replay has something to fix
    pairs = zip(rollouts, got.routes, strict=True)
    agree = torch.cat([agreeing(c.routes.experts, r.experts) for c, r in pairs])
    assert not agree.all()


@pytest.mark.parametrize("mode", ["engine-ids", "engine"])
def test_replaying_ranks_route_as_the_engine_and_score_as_hf(moe_model, rollouts, ranks, mode):
    sequences = _sequences(rollouts)
    engine_routes = [c.routes for c in rollouts]
    got = ranks[mode].recompute(sequences, routes=engine_routes)
    hf = backend("hf", moe_model, options={"routing_replay": mode})
    want = hf.recompute(sequences, routes=engine_routes)
    natural = ranks["none"].recompute(sequences)
    assert got.routes is not None and len(got.routes) == len(sequences)
    moved = 0.0
    for ours, engine, lp, ref, plain in zip(
        got.routes, engine_routes, got.logprobs, want.logprobs, natural.logprobs, strict=True
    ):
        assert torch.equal(ours.experts, engine.experts)
        if mode == "engine":
            # the engine's combine weights, as it reported them
            assert torch.equal(ours.weights, engine.weights)
        assert lp.shape == ref.shape
        assert (lp - ref).abs().max() < 1e-5
        moved = max(moved, float((lp - plain).abs().max()))
    # the replay changed the scores: the routes reached the ranks' forwards
    assert moved > 1e-3


def test_dense_model_has_no_routes(default_model):
    dense = backend("fsdp", default_model, options={"world_size": "1", "routing_replay": "engine"})
    try:
        out = dense.recompute([[5, 6, 7, 8], [9, 10, 11]], routes=[None, None])
    finally:
        dense.close()
    assert out.routes is None
    assert [len(lp) for lp in out.logprobs] == [3, 2]


def test_the_option_is_reported_and_checked(moe_model, ranks):
    assert ranks["engine-ids"].info()["options"] == {
        "world_size": "2",
        "routing_replay": "engine-ids",
    }
    assert "routing_replay" not in ranks["engine-ids"].info()
    for options in ({"routing_replay": "always"}, {"routing_replay": "engine", "world_size": "0"}):
        with pytest.raises(UsageError) as caught:
            backend("fsdp", moe_model, options=options)
        assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="routing_replay"):
        BACKENDS.get("fsdp").check_options({"routing_replay": "ids"})


def test_routes_must_match_the_sequences(rollouts, ranks):
    with pytest.raises(ValueError, match="routes for"):
        ranks["engine-ids"].recompute(_sequences(rollouts), routes=[rollouts[0].routes])
