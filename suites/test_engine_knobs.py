"""Engine knobs as property dimensions.

Scheduling and caching settings are meant to change speed, not numbers. For each knob the
engine offers (``Engine.knobs()``: chunked prefill on/off and its chunk size, prefix caching
on/off, max_num_seqs, eager vs compiled), an engine started with the knob's value scores the
same sequences and samples the same rollouts as the session's engine, within the active
profile. Rollouts run twice so that, with prefix caching on, the second pass reads its prompts
from the cache: a cache hit must not change logprobs beyond the profile. A knob the engine does
not offer is skipped with the reason.
"""

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.engines import ENGINES
from conformance.strategies import sampling_specs
from conformance.suite_support import generated_rows, new_tokens, prompt_batches

#: the knobs this suite knows how to vary; each value of each starts one engine
KNOBS = (
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "max_num_seqs",
    "enforce_eager",
)
#: the most values per knob an engine may offer (extra tests skip when it offers fewer)
MAX_VALUES = 2


@pytest.fixture
def variant(request, engine, tim) -> Iterator[tuple[str, Any, Any]]:
    """An engine like the session's with one knob changed; stopped when the test ends."""
    knob, index = request.param
    offered = engine.knobs()
    if knob not in offered:
        pytest.skip(f"engine {engine.name!r} does not offer the knob {knob}")
    if index >= len(offered[knob]):
        pytest.skip(f"engine {engine.name!r} offers {len(offered[knob])} value(s) of {knob}")
    value = offered[knob][index]
    config = tim.spec.engine_config(tim.model_info.path, **{knob: value})
    started = ENGINES.get(engine.name)(config)
    try:
        yield knob, value, started
    finally:
        started.close()


@pytest.mark.parametrize(
    "variant",
    [(knob, index) for knob in KNOBS for index in range(MAX_VALUES)],
    indirect=True,
    ids=lambda param: f"{param[0]}-{param[1]}",
)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_knob_keeps_logprobs(data, variant, engine, model, depth, recorder):
    knob, value, changed = variant
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    recorder.case(sequences, shape, knob=knob, value=value)
    recorder.check_profile(recorder.measure(engine.score(sequences), changed.score(sequences)))

    spec = data.draw(sampling_specs(max_new_tokens=new_tokens(depth)), label="sampling")
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec, knob=knob, value=value)
    for _ in range(2):
        try:
            completions = changed.generate(prompts, spec)
        except NotImplementedError:
            # a rollout this knob value cannot sample (the engine says why); scoring was checked
            return
        rescored = engine.score([c.sequence for c in completions])
        lp_train, lp_infer, positions = generated_rows(completions, rescored)
        recorder.check_profile(recorder.measure(lp_train, lp_infer, positions=positions))
