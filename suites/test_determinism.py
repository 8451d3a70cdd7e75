"""Determinism.

The same case submitted twice, and in another batch order, gives the same log-probabilities:
bitwise under the ``exact`` profile, within the active profile otherwise; the fraction of
positions that differ (1 − exact_match_rate) and the largest difference (abs_diff_max) are
always recorded, as vLLM's and SGLang's determinism tests report them. Seeded sampling repeats
its tokens too. An engine that cannot seed its sampling (``info()["seeded"]`` false: SGLang on
CPU) still has its scoring checked.

The first answer may be the one the engine gave an earlier check making the same request
(``shared_engine``); the second is always asked of the engine, after whatever ran between.
"""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.metric_table import breach
from conformance.suite_support import prompt_batches, rollout_specs


def another_order(sequences: list[list[int]]) -> list[int]:
    """A shuffle of the batch's rows that the batch itself seeds, never the batch's own order
    (for two or more rows). Not drawn: drawn, it would steer Hypothesis's later draws away from
    the batches prefill parity draws, which the engine then scores once for both
    (``shared_engine``)."""
    order = list(range(len(sequences)))
    random.Random(repr(sequences)).shuffle(order)
    if order == sorted(order):
        order = order[1:] + order[:1]
    return order


@given(data=st.data())
def test_scoring_is_deterministic(data, engine, shared_engine, model, depth, recorder):
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    order = another_order(sequences)
    recorder.case(sequences, shape, order=order)

    first = shared_engine.score(sequences)
    again = engine.score(sequences)
    shuffled = engine.score([sequences[i] for i in order])
    reordered = [shuffled[order.index(i)] for i in range(len(sequences))]

    measured = recorder.measure(
        [*first, *first],
        [*again, *reordered],
        sides=("the engine's first scoring's", "the engine's repeated scoring's"),
    )
    recorder.check_profile(measured)


@given(data=st.data())
def test_seeded_sampling_is_deterministic(data, engine, shared_engine, model, depth, recorder):
    if engine.info().get("seeded") is False:
        pytest.skip(f"engine {engine.name!r} cannot seed its sampling (its info() says so)")
    spec = data.draw(rollout_specs(model, depth), label="sampling")
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec)

    first = shared_engine.generate(prompts, spec)
    again = engine.generate(prompts, spec)

    changed = [
        row for row, (a, b) in enumerate(zip(first, again, strict=True)) if a.tokens != b.tokens
    ]
    if changed:
        row = changed[0]
        a, b = first[row].tokens, again[row].tokens
        step = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        recorder.fail(
            f"the same seeded case sampled different tokens: sequence {row} diverges at "
            f"token {step} ({a[step : step + 1]} vs {b[step : step + 1]})",
            breach=breach("rollouts_changed_on_rerun", len(changed), 0),
        )
    metrics = recorder.measure(
        [c.logprobs for c in first],
        [c.logprobs for c in again],
        sides=("the engine's first run's", "the engine's rerun's"),
    )
    recorder.check_profile(metrics)
