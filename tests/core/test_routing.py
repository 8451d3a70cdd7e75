"""MoE routes as data (``conformance.routing``) on the embedded MoE model: hf-generate reports
where it routed every scored position, the ``hf`` backend routes an fp32 rollout exactly as an
fp32 engine did in every layout, and with ``routing_replay`` it routes a bf16 engine's rollout as
the engine did (without replay it does not); the routing metrics on hand-built routes; a dense
model has no routes; ``embedded:`` model names, and the MoE profiles a stack implies."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conformance.backends import BACKENDS, BackendConfig
from conformance.dtypes import DTYPE_NAMES
from conformance.engines import ENGINES, EngineConfig, SamplingSpec
from conformance.errors import ModelError
from conformance.models import model_folder
from conformance.options import implied_profile
from conformance.profiles import load_profile
from conformance.recorder import CheckRecord, Recorder
from conformance.routing import REPLAY_MODES, Routes, agreeing, routing_metrics

#: the embedded MoE model's shape: 2 MoE layers, top 2 of 4 experts
LAYERS, TOP_K, EXPERTS = 2, 2, 4
#: prompts of uneven lengths (1 to 13 tokens), so padding and packing offsets differ per row
PROMPTS = [[5 + (7 * i) % 300 + j for j in range(1 + (5 * i) % 13)] for i in range(24)]
#: 24 × 64: a bf16 engine and the fp32 backend route some (token, layer) differently here
#: (15 of 3,362 pairs at seed 0, 12 to 15 at seeds 0-2, with 1 or 2 torch threads)
SPEC = SamplingSpec(max_new_tokens=64, seed=0)
#: smaller than the batch, and not a divisor of it: the last micro-batch is short
MICRO = 5
LAYOUTS = ("right-pad", "left-pad", "packed")
#: ids that end a rollout: with them some rows stop, at different steps, and some run to length
STOP_IDS = tuple(range(100, 110))


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """One torch thread for the module (as conftest's ``one_torch_thread``, module-wide so the
    rollouts the tests share are drawn with it too): two spin-wait against each other on a
    loaded 2-core machine, and this module ran 20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def moe() -> Path:
    return model_folder("embedded:moe")


def _rollouts(model: Path, dtype: str):
    engine = ENGINES.get("hf-generate")(EngineConfig(model=model, dtype=dtype))
    try:
        return engine.generate(PROMPTS, SPEC)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def fp32_rollouts(moe):
    return _rollouts(moe, "float32")


@pytest.fixture(scope="module")
def bf16_rollouts(moe):
    return _rollouts(moe, "bfloat16")


def _backend(model: Path, **config):
    return BACKENDS.get("hf")(BackendConfig(model=model, **config))


def _flips(engine: list[Routes], backend: list[Routes]) -> int:
    """(position, layer) pairs whose top-k sets differ, over the batch."""
    return sum(
        int((~agreeing(e.experts, b.experts)).sum()) for e, b in zip(engine, backend, strict=True)
    )


def test_the_engine_reports_a_route_per_scored_position(fp32_rollouts):
    for completion in fp32_rollouts:
        routes = completion.routes
        assert routes is not None
        n = len(completion.sequence)
        assert routes.experts.shape == (n - 1, LAYERS, TOP_K)
        assert routes.experts.dtype == torch.int64
        assert int(routes.experts.min()) >= 0 and int(routes.experts.max()) < EXPERTS
        # k distinct experts per (position, layer)
        assert (routes.experts.sort(-1).values.diff(dim=-1) > 0).all()
        assert routes.weights is not None
        assert routes.weights.shape == routes.experts.shape
        assert routes.weights.dtype == torch.float32
        assert (routes.weights > 0).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_fp32_backend_routes_as_the_fp32_engine(moe, fp32_rollouts, layout):
    backend = _backend(moe, micro_batch_size=MICRO, layout=layout)
    out = backend.recompute([c.sequence for c in fp32_rollouts])
    assert out.routes is not None and len(out.routes) == len(fp32_rollouts)
    for completion, routes in zip(fp32_rollouts, out.routes, strict=True):
        assert routes.experts.shape == completion.routes.experts.shape
        agree = agreeing(completion.routes.experts, routes.experts)
        assert agree.all(), f"{int((~agree).sum())} (position, layer) sets differ"
        # the combine weights too, up to fp32 decode-vs-forward rounding (order-free: sorted)
        order_e = completion.routes.experts.argsort(-1)
        order_b = routes.experts.argsort(-1)
        torch.testing.assert_close(
            routes.weights.gather(-1, order_b),
            completion.routes.weights.gather(-1, order_e),
            atol=1e-5,
            rtol=0,
        )


def test_rollouts_that_stop_early_have_a_route_per_scored_position(moe):
    """Rows that stop at different steps: each row's routes end at its own last fed token (the
    decode steps after a row stopped feed padding, which routes nowhere of the row's)."""
    engine = ENGINES.get("hf-generate")(EngineConfig(model=moe))
    stops = SamplingSpec(max_new_tokens=48, seed=1, ignore_eos=False, stop_token_ids=STOP_IDS)
    try:
        completions = engine.generate(PROMPTS[:12], stops)
    finally:
        engine.close()
    lengths = {len(c.tokens) for c in completions}
    assert len(lengths) > 2, lengths
    assert {c.finish_reason for c in completions} == {"stop", "length"}
    out = _backend(moe, micro_batch_size=MICRO).recompute([c.sequence for c in completions])
    for completion, routes in zip(completions, out.routes, strict=True):
        assert completion.routes.experts.shape == (len(completion.sequence) - 1, LAYERS, TOP_K)
        assert agreeing(completion.routes.experts, routes.experts).all()


def test_routes_are_the_same_in_every_layout(moe, bf16_rollouts):
    """Where the backend itself routes (no replay), laying the batch out otherwise does not
    change a route: the rows each layout reads the routes from are the scored positions."""
    sequences = [c.sequence for c in bf16_rollouts]
    outs = [
        _backend(moe, micro_batch_size=MICRO, layout=layout).recompute(sequences).routes
        for layout in LAYOUTS
    ]
    for other in outs[1:]:
        assert _flips(outs[0], other) == 0


@pytest.fixture(scope="module")
def unreplayed(moe, bf16_rollouts):
    """The fp32 backend's own routes of the bf16 rollouts."""
    backend = _backend(moe, micro_batch_size=MICRO, options={"routing_replay": "none"})
    return backend.recompute(
        [c.sequence for c in bf16_rollouts], routes=[c.routes for c in bf16_rollouts]
    )


def test_without_replay_a_bf16_engine_and_fp32_backend_route_differently(bf16_rollouts, unreplayed):
    # routing_replay=none recomputes with its own routes although it was given the engine's
    flips = _flips([c.routes for c in bf16_rollouts], unreplayed.routes)
    total = sum(c.routes.positions * LAYERS for c in bf16_rollouts)
    assert 0 < flips < 0.05 * total, (flips, total)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["engine-ids", "engine"])
def test_replay_routes_as_the_bf16_engine(moe, bf16_rollouts, unreplayed, mode, layout):
    backend = _backend(moe, micro_batch_size=MICRO, layout=layout, options={"routing_replay": mode})
    engine_routes = [c.routes for c in bf16_rollouts]
    out = backend.recompute([c.sequence for c in bf16_rollouts], routes=engine_routes)
    assert out.routes is not None and len(out.routes) == len(engine_routes)
    moved = 0.0
    for given, got, lp, plain in zip(
        engine_routes, out.routes, out.logprobs, unreplayed.logprobs, strict=True
    ):
        assert torch.equal(got.experts, given.experts)
        if mode == "engine":
            # the engine's combine weights, as reported
            assert torch.equal(got.weights, given.weights)
        else:
            # the backend's own router probabilities at the engine's experts: not the engine's
            # bf16 ones bit for bit, but close
            torch.testing.assert_close(got.weights, given.weights, atol=2e-2, rtol=0)
        moved = max(moved, float((lp - plain).abs().max()))
    # the replayed routes reached the forward: the scores moved where routes flipped
    assert moved > 1e-3


def test_engine_replay_uses_the_engine_weights_and_ids_replay_its_own(moe, bf16_rollouts):
    sequences = [c.sequence for c in bf16_rollouts]
    engine_routes = [c.routes for c in bf16_rollouts]
    ids, full = (
        _backend(moe, micro_batch_size=MICRO, options={"routing_replay": mode}).recompute(
            sequences, routes=engine_routes
        )
        for mode in ("engine-ids", "engine")
    )
    # the bf16 engine's combine weights differ from the fp32 router's somewhere
    pairs = zip(ids.routes, full.routes, strict=True)
    assert any(not torch.equal(a.weights, b.weights) for a, b in pairs)
    # and the weights reach the forward: the scores differ
    pairs = zip(ids.logprobs, full.logprobs, strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)


def test_replay_modes_are_checked(moe):
    assert REPLAY_MODES == ("none", "engine-ids", "engine")
    from conformance.errors import UsageError

    with pytest.raises(UsageError, match="routing_replay"):
        _backend(moe, options={"routing_replay": "always"})
    with pytest.raises(UsageError, match="routing_replay"):
        BACKENDS.get("hf").check_options({"routing_replay": "ids"})


def test_routes_that_do_not_line_up_with_the_sequences_are_refused(moe, bf16_rollouts):
    backend = _backend(moe, options={"routing_replay": "engine-ids"})
    sequences = [c.sequence for c in bf16_rollouts]
    routes = [c.routes for c in bf16_rollouts]
    with pytest.raises(ValueError, match="routes for"):
        backend.recompute(sequences, routes=routes[:-1])
    # another sequence's routes: the lengths differ, so the replay cannot be this sequence's
    shifted = routes[1:] + routes[:1]
    with pytest.raises(ValueError, match="positions for its"):
        backend.recompute(sequences, routes=shifted)


def test_a_dense_model_has_no_routes(default_model):
    engine = ENGINES.get("hf-generate")(EngineConfig(model=default_model))
    try:
        completions = engine.generate(PROMPTS[:4], SamplingSpec(max_new_tokens=8, seed=0))
    finally:
        engine.close()
    assert all(c.routes is None for c in completions)
    for layout in LAYOUTS:
        backend = _backend(
            default_model, micro_batch_size=3, layout=layout, options={"routing_replay": "engine"}
        )
        out = backend.recompute(
            [c.sequence for c in completions], routes=[c.routes for c in completions]
        )
        assert out.routes is None
        assert [len(lp) for lp in out.logprobs] == [len(c.sequence) - 1 for c in completions]


# -- routing_metrics on hand-built routes -----------------------------------------------------
def _routes(*positions: list[list[int]]) -> torch.Tensor:
    """``[positions, layers, k]`` experts from per-position lists of per-layer top-k lists."""
    return torch.tensor(positions, dtype=torch.long)


#: two sequences, 2 layers, top 2. Sequence 0: position 0 the same sets in another order (kept),
#: position 1 layer 0 differs (flipped), position 2 identical (kept); sequence 1: position 0
#: kept, position 1 differs in both layers (flipped, 2 pairs)
ENGINE = [
    _routes([[0, 1], [2, 3]], [[0, 1], [2, 3]], [[1, 3], [0, 2]]),
    _routes([[3, 2], [1, 0]], [[0, 1], [0, 1]]),
]
BACKEND = [
    _routes([[1, 0], [3, 2]], [[0, 2], [2, 3]], [[1, 3], [0, 2]]),
    _routes([[2, 3], [0, 1]], [[0, 3], [2, 1]]),
]


def test_agreement_ignores_the_order_within_the_top_k():
    assert agreeing(ENGINE[0], BACKEND[0]).tolist() == [[True, True], [False, True], [True, True]]
    assert agreeing(ENGINE[1], BACKEND[1]).tolist() == [[True, True], [False, False]]
    # a set differing in one of its k experts disagrees, even when the other matches in place
    assert not agreeing(_routes([[0, 1]]), _routes([[0, 2]])).any()


def test_routing_metrics_on_hand_built_routes():
    diffs = [torch.tensor([0.1, 1.0, 0.3]), torch.tensor([0.2, 3.0])]
    metrics = routing_metrics(ENGINE, BACKEND, diffs)
    # 10 (token, layer) pairs, 3 disagree; 5 tokens, 2 with a flip
    assert metrics["route_agreement"] == pytest.approx(7 / 10)
    assert metrics["route_flip_tokens"] == pytest.approx(2 / 5)
    assert metrics["abs_diff_mean_route_kept"] == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    assert metrics["abs_diff_mean_route_flipped"] == pytest.approx((1.0 + 3.0) / 2)


def test_nonfinite_diffs_are_left_out_of_the_split_means():
    diffs = [torch.tensor([math.nan, 1.0, 0.3]), torch.tensor([0.2, math.inf])]
    metrics = routing_metrics(ENGINE, BACKEND, diffs)
    # the agreement counts every token; the means only the finite ones
    assert metrics["route_agreement"] == pytest.approx(7 / 10)
    assert metrics["route_flip_tokens"] == pytest.approx(2 / 5)
    assert metrics["abs_diff_mean_route_kept"] == pytest.approx((0.3 + 0.2) / 2)
    assert metrics["abs_diff_mean_route_flipped"] == pytest.approx(1.0)
    # a side whose every token is nonfinite has no mean
    only_nan = [torch.tensor([0.1, math.nan, 0.3]), torch.tensor([0.2, -math.inf])]
    assert "abs_diff_mean_route_flipped" not in routing_metrics(ENGINE, BACKEND, only_nan)


def test_without_flips_there_is_no_flipped_mean():
    diffs = [torch.tensor([0.1, 1.0, 0.3]), torch.tensor([0.2, 3.0])]
    metrics = routing_metrics(ENGINE, ENGINE, diffs)
    assert metrics["route_agreement"] == 1.0
    assert metrics["route_flip_tokens"] == 0.0
    assert metrics["abs_diff_mean_route_kept"] == pytest.approx(4.6 / 5)
    assert "abs_diff_mean_route_flipped" not in metrics


def test_the_recorder_measures_and_pools_the_routing_metrics():
    recorder = Recorder(load_profile("moe-fp32"), log=lambda **_: None, replay=lambda n: n)
    recorder.current = CheckRecord(suite="routing", name="t", nodeid="t")
    train = [[-1.0, -2.0, -3.0], [-1.0, -2.0]]
    infer = [[-1.1, -1.0, -3.3], [-0.8, -5.0]]
    first = recorder.measure(train[:1], infer[:1], routes=(ENGINE[:1], BACKEND[:1]))
    assert first["route_agreement"] == pytest.approx(5 / 6)
    assert first["abs_diff_mean_route_flipped"] == pytest.approx(1.0)
    recorder.measure(train[1:], infer[1:], routes=(ENGINE[1:], BACKEND[1:]))
    pooled = recorder.current.pooled()
    assert pooled["route_agreement"] == pytest.approx(7 / 10)
    assert pooled["route_flip_tokens"] == pytest.approx(2 / 5)
    assert pooled["abs_diff_mean_route_kept"] == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    assert pooled["abs_diff_mean_route_flipped"] == pytest.approx((1.0 + 3.0) / 2)


# -- embedded models and the MoE profiles -----------------------------------------------------
def test_embedded_moe_is_an_moe_model(moe):
    from conformance.models import declared_experts, inspect_model

    assert moe == model_folder("embedded:moe")
    assert declared_experts(moe) == EXPERTS
    assert inspect_model(moe).num_experts == EXPERTS
    assert declared_experts(model_folder("embedded:default")) == 0


def test_an_unknown_embedded_model_is_one_line_naming_the_known_ones():
    with pytest.raises(ModelError) as caught:
        model_folder("embedded:nope")
    message = str(caught.value)
    assert "\n" not in message
    assert "'nope'" in message and "embedded:moe" in message


def test_an_moe_stack_implies_an_moe_profile():
    assert implied_profile("bfloat16", "float32", moe=True) == "moe-bf16"
    assert implied_profile("float32", "float32", moe=True) == "moe-fp32"
    assert implied_profile("float16", "float32", moe=True) == "moe-fp16"
    assert implied_profile("bfloat16", "float32") == "bf16"
    names = {implied_profile(e, b, moe=True) for e in DTYPE_NAMES for b in DTYPE_NAMES}
    assert names == {"moe-fp32", "moe-bf16", "moe-fp16"}
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        # the routing metrics are bounded
        assert {"route_agreement", "route_flip_tokens"} <= set(profile.thresholds)
