"""Weight sync (refit).

RL pushes the trainer's new weights into the engine every step (``load_weights``). After a push
of changed weights the engine agrees with a backend holding the same weights, within the active
profile, so a silent no-op or a partial refit fails (imperfect refit is a mismatch source
NeMo-RL names; TRL with vLLM sleep mode once left weights unsynced). Pushing the original
weights back restores the original numbers. Engines that cannot take weights skip with that
reason.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import prompt_batches
from conformance.weights import perturbed, read_weights, write_model


@pytest.fixture(scope="module")
def original_weights(model):
    return read_weights(model.path)


@given(data=st.data())
def test_engine_takes_new_weights(
    data, engine, backend, model, depth, recorder, tim, original_weights, tmp_path_factory
):
    seed = data.draw(st.integers(1, 2**31 - 1), label="weights_seed")
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    recorder.case(sequences, shape, weights_seed=seed)
    new = perturbed(original_weights, seed)
    folder = write_model(new, model.path, tmp_path_factory.mktemp("refit"))

    try:
        engine.load_weights(new)
    except NotImplementedError as exc:
        pytest.skip(str(exc).splitlines()[0])
    try:
        refitted = engine.score(sequences)
    finally:
        engine.load_weights(original_weights)
    with tim.backend_for(folder) as holding_new:
        expected = holding_new.recompute(sequences).logprobs
    restored = engine.score(sequences)
    original = backend.recompute(sequences).logprobs

    recorder.check_profile(recorder.measure([*expected, *original], [*refitted, *restored]))
