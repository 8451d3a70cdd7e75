"""Prefill parity.

For any batch of token sequences, the engine scoring them in one prefill and the backend
recomputing them the way a trainer does give the same per-token log-probabilities, within the
active profile. The backend lays the batch out with the padding side Hypothesis drew; batches
repeat prompts (GRPO groups) and share prefixes as RL batches do. A batch another check had
the engine score already is judged on that scoring (``shared_engine``).
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import prompt_batches


@given(data=st.data())
def test_prefill_parity(data, shared_engine, model, depth, recorder, tim):
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    recorder.case(sequences, shape)
    backend = tim.backend_variant(layout=f"{shape.padding_side}-pad")

    lp_infer = shared_engine.score(sequences)
    lp_train = backend.recompute(sequences).logprobs

    recorder.check_profile(recorder.measure(lp_train, lp_infer, contexts=sequences))
