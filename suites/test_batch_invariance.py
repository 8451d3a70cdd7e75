"""Batch invariance.

A sequence's log-probabilities do not depend on what else is in the batch: scored alone and
scored at any position inside batches of other sizes and compositions, by the engine and by the
backend (at any micro-batch size). Under the ``exact`` profile this demands bitwise equality;
the fraction of positions that differ is always recorded (1 − exact_match_rate).
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import case, prompt_batches


def _draw_placement(data, model):
    shape, others = data.draw(prompt_batches(model, min_len=2, max_batch=7), label="others")
    (target,) = data.draw(prompt_batches(model, min_len=2, max_batch=1), label="target")[1]
    index = data.draw(st.integers(0, len(others)), label="index")
    return shape, target, [*others[:index], target, *others[index:]], index


@given(data=st.data())
def test_engine_batch_invariance(data, engine, model, recorder):
    shape, target, batch, index = _draw_placement(data, model)

    alone = engine.score([target])
    in_batch = [engine.score(batch)[index]]

    example = case(batch, shape, target_index=index)
    metrics = recorder.measure(alone, in_batch, case=example)
    recorder.check_profile(metrics, example)


@given(data=st.data())
def test_backend_batch_invariance(data, model, recorder, tim):
    shape, target, batch, index = _draw_placement(data, model)
    micro_batch = data.draw(st.sampled_from([1, 2, 4, 8]), label="micro_batch_size")

    alone = tim.backend_variant(micro_batch_size=1).recompute([target]).logprobs
    batched = tim.backend_variant(
        micro_batch_size=micro_batch, layout=f"{shape.padding_side}-pad"
    ).recompute(batch)
    in_batch = [batched.logprobs[index]]

    example = case(batch, shape, target_index=index, micro_batch_size=micro_batch)
    metrics = recorder.measure(alone, in_batch, case=example)
    recorder.check_profile(metrics, example)
