"""Batch invariance.

A sequence's log-probabilities do not depend on what else is in the batch: scored alone and
scored at any position inside batches of other sizes and compositions (up to the search depth's
batch size), by the engine and by the backend (at any micro-batch size). Under the ``exact``
profile this demands bitwise equality; the fraction of positions that differ is always recorded
(1 − exact_match_rate).

Kernels switch implementation at batch-size thresholds (cuBLAS heuristics, CUDA-graph capture
sizes), so besides its drawn examples each property runs one example at the top of every
power-of-two bucket of the depth's batch sizes (1, 2, 3–4, …, 17–32; deep up to 64): a defect
confined to one middle range shows in every run.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import prompt_batches


def _draw_placement(data, model, depth):
    shape, batch = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    index = data.draw(st.integers(0, len(batch) - 1), label="index")
    return shape, batch[index], batch, index


@pytest.mark.tim_batch_buckets
@given(data=st.data())
def test_engine_batch_invariance(data, engine, shared_engine, model, depth, recorder):
    shape, target, batch, index = _draw_placement(data, model, depth)
    recorder.case(batch, shape, target_index=index)

    alone = engine.score([target])
    # the batch as an earlier check may have had it scored already
    in_batch = [shared_engine.score(batch)[index]]

    sides = ("the engine's lone-sequence", "the engine's in-batch")
    recorder.check_profile(recorder.measure(alone, in_batch, sides=sides, contexts=[target]))


@pytest.mark.tim_batch_buckets
@given(data=st.data())
def test_backend_batch_invariance(data, model, depth, recorder, tim):
    shape, target, batch, index = _draw_placement(data, model, depth)
    micro_batch = data.draw(st.sampled_from([1, 2, 4, 8]), label="micro_batch_size")
    recorder.case(batch, shape, target_index=index, micro_batch_size=micro_batch)

    alone = tim.backend_variant(micro_batch_size=1).recompute([target]).logprobs
    batched = tim.backend_variant(
        micro_batch_size=micro_batch, layout=f"{shape.padding_side}-pad"
    ).recompute(batch)
    in_batch = [batched.logprobs[index]]

    sides = ("the backend's lone-sequence", "the backend's in-batch")
    recorder.check_profile(recorder.measure(alone, in_batch, sides=sides, contexts=[target]))
