"""Mixture-of-experts routing — where each token went, engine against backend.

A tiny numerical difference flips which experts an MoE token goes to, and a flipped route is a
different function, not a rounding error: the R3 paper (arXiv 2510.11370) finds ~10 % of
routers choosing differently between training and inference on Qwen3-30B-A3B. Engines that
report their routes (``Completion.routes``) are compared with the backend's own routing of the
same rollouts: the fraction of (token, layer) top-k sets that agree, the fraction of tokens
with a flip, and the log-prob mismatch split into tokens routed alike and tokens with a flip,
each within the active profile.

Routing replay (R3; slime ``--use-rollout-routing-replay``, verl ``router_replay.mode=R3``): a
backend run with ``routing_replay`` recomputes with the engine's routes. Its routes then equal
the engine's at every scored position (a replay that drops them fails here, on the smallest
batch Hypothesis finds), and the tokens the backend had routed differently lose the mismatch
the flip caused: their mean |log ρ| with replay is no larger than without.

A dense model, an engine that reports no routes and a backend that cannot tell its own skip,
saying which.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.routing import agreeing
from conformance.suite_support import (
    generated_routes,
    generated_rows,
    prompt_batches,
    rollout_specs,
)

#: the replay the replay check runs when the stack's backend replays none: the engine's ids
#: and, where it reports them, its combine weights
DEFAULT_REPLAY = "engine"


@pytest.fixture(scope="module")
def routed(engine, model):
    """Skip unless the stack can compare routes: an MoE model and an engine reporting them."""
    if not model.num_experts:
        pytest.skip("a dense model has no routes (routing is checked on MoE models)")
    if engine.capabilities.no_routes is not None:
        pytest.skip(engine.capabilities.no_routes)
    return engine


def _rollouts(data, engine, model, depth, recorder):
    spec = data.draw(rollout_specs(model, depth), label="sampling")
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec)
    return engine.generate(prompts, spec)


def _recompute(backend, completions, **replay):
    out = backend.recompute([c.sequence for c in completions], **replay)
    if out.routes is None:
        pytest.skip(f"backend {backend.name!r} does not report the experts it routed to")
    return out


@given(data=st.data())
def test_routing_agreement(data, routed, tim, model, depth, recorder):
    natural = tim.backend_variant(options={"routing_replay": "none"})
    completions = _rollouts(data, routed, model, depth, recorder)
    out = _recompute(natural, completions)
    lp_train, lp_infer, positions = generated_rows(completions, out.logprobs)
    routes = generated_routes(completions, out.routes)
    contexts = [c.sequence for c in completions]
    recorder.check_profile(
        recorder.measure(lp_train, lp_infer, positions=positions, routes=routes, contexts=contexts)
    )


@given(data=st.data())
def test_routing_replay(data, routed, tim, backend, model, depth, recorder):
    mode = backend.config.options.get("routing_replay", "none")
    mode = DEFAULT_REPLAY if mode == "none" else mode
    recorder.describe(routing_replay=mode)
    replaying = tim.backend_variant(options={"routing_replay": mode})
    completions = _rollouts(data, routed, model, depth, recorder)
    engine_routes = [c.routes for c in completions]
    replayed = _recompute(replaying, completions, routes=engine_routes)
    lp_train, lp_infer, positions = generated_rows(completions, replayed.logprobs)
    metrics = recorder.measure(
        lp_train,
        lp_infer,
        positions=positions,
        routes=generated_routes(completions, replayed.routes),
        contexts=[c.sequence for c in completions],
    )
    differ = sum(
        int((~agreeing(given.experts, got.experts)).sum())
        for given, got in zip(engine_routes, replayed.routes, strict=True)
    )
    if differ:
        total = sum(r.experts[..., 0].numel() for r in engine_routes)
        recorder.fail(
            f"routing replay ({mode}) did not route as the engine did: {differ} of {total} "
            "(token, layer) expert sets differ from the engine's (expected 0)",
            metrics,
        )

    natural = tim.backend_variant(options={"routing_replay": "none"})
    without = natural.recompute([c.sequence for c in completions])
    lp_natural, _, _ = generated_rows(completions, without.logprobs)
    flipped = [
        ~agreeing(e, b).all(dim=-1)
        for e, b in zip(*generated_routes(completions, without.routes), strict=True)
    ]
    if any(f.any() for f in flipped):
        with_replay = _mean_gap_at(lp_train, lp_infer, flipped)
        without_replay = _mean_gap_at(lp_natural, lp_infer, flipped)
        # a flip between near-tied experts costs nothing, and then a token or two decide the
        # comparison: replay must be worse by more than the spread of tokens routed alike (a
        # sound bf16 stack's one flipped token read 0.0067 with replay, 0.0035 without)
        spread = tim.profile.bounds("routing").get("abs_diff_mean_route_kept", 0.0)
        if with_replay > without_replay + spread:
            recorder.fail(
                f"routing replay ({mode}) left more mismatch on the tokens the backend routes "
                f"differently: mean |log ρ| {with_replay:.4g} with replay > {without_replay:.4g} "
                f"without + {spread:.4g} (the profile's mean |log ρ| on tokens routed alike)",
                metrics,
            )
    recorder.check_profile(metrics)


def _mean_gap_at(lp_train, lp_infer, where) -> float:
    """Mean |lp_train − lp_infer| over the tokens ``where`` marks."""
    gaps = [
        (torch.as_tensor(t, dtype=torch.float64) - torch.as_tensor(i, dtype=torch.float64)).abs()[w]
        for t, i, w in zip(lp_train, lp_infer, where, strict=True)
    ]
    return float(torch.cat(gaps).mean())
