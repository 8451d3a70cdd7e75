"""Parallelism invariance.

A sequence's log-probabilities do not depend on how many devices or processes the model is split
over. The engine at the tensor-parallel size N the stack runs at scores the same sequences as the
same engine at size 1, and the tokens it samples at size N get the log-probabilities size 1 gives
them; the backend at world size N recomputes what it recomputes at world size 1. Under the
``exact`` profile this demands bitwise equality; the fraction of positions that differ is always
recorded (1 − exact_match_rate).

Which option is the parallel setting, and the size the stack runs at, is each engine's and
backend's own declaration (an engine's ``capabilities.parallel``, a backend's ``parallel``). A
component without one, or one running at size 1, is skipped with the reason.
"""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import generated_rows, prompt_batches, rollout_specs


def _parallel_size(component: Any, setting: Any, kind: str) -> dict[str, int]:
    """``{option: size}`` of the stack's component under its declared parallel ``setting``;
    skips where there is nothing to compare."""
    if setting is None:
        pytest.skip(f"{kind} {component.name!r} has no parallel setting")
    size = setting.size(component.config.options)
    if size == 1:
        pytest.skip(
            f"{kind} {component.name!r} runs at {setting.option}=1, the size it is compared "
            f"with; run it at N > 1 (--{kind}-option {setting.option}=2)"
        )
    return {setting.option: size}


@pytest.fixture(scope="module")
def single_engine(engine, tim) -> tuple[Any, dict[str, int]]:
    """The stack's engine at parallel size 1, and the stack's own ``{option: size}``."""
    parallel = _parallel_size(engine, engine.capabilities.parallel, "engine")
    return tim.engine_variant(**dict.fromkeys(parallel, "1")), parallel


@pytest.fixture(scope="module")
def single_backend(backend, tim) -> tuple[Any, dict[str, int]]:
    """The stack's backend at parallel size 1, and the stack's own ``{option: size}``."""
    parallel = _parallel_size(backend, backend.parallel, "backend")
    return tim.backend_variant(options=dict.fromkeys(parallel, "1")), parallel


@given(data=st.data())
def test_engine_parallelism_invariance(data, single_engine, engine, model, depth, recorder):
    single, parallel = single_engine
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    recorder.case(sequences, shape, **parallel)
    recorder.check_profile(recorder.measure(single.score(sequences), engine.score(sequences)))

    spec = data.draw(rollout_specs(model, depth), label="sampling")
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="rollout"
    )
    recorder.case(prompts, shape, spec, **parallel)
    completions = engine.generate(prompts, spec)
    rescored = single.score([c.sequence for c in completions])
    lp_single, lp_parallel, positions = generated_rows(completions, rescored)
    recorder.check_profile(recorder.measure(lp_single, lp_parallel, positions=positions))


@given(data=st.data())
def test_backend_parallelism_invariance(data, single_backend, backend, model, depth, recorder):
    single, parallel = single_backend
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    recorder.case(sequences, shape, **parallel)

    lp_single = single.recompute(sequences).logprobs
    lp_parallel = backend.recompute(sequences).logprobs

    recorder.check_profile(recorder.measure(lp_single, lp_parallel))
