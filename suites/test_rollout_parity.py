"""Rollout parity — the training–inference mismatch itself.

The engine samples rollouts and reports the log-probability of each token it sampled; the
backend recomputes those tokens. With identical weights the two agree within the active
profile, whatever the sampling spec (the engine must report raw model logprobs).
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.strategies import sampling_specs
from conformance.suite_support import case, generated_rows, prompt_batches


@given(data=st.data())
def test_rollout_parity(data, engine, backend, model, recorder):
    spec = data.draw(sampling_specs(), label="sampling")
    shape, prompts = data.draw(prompt_batches(model, max_new_tokens=spec.max_new_tokens), "batch")

    completions = engine.generate(prompts, spec)
    recomputed = backend.recompute([c.sequence for c in completions]).logprobs
    lp_train, lp_infer, positions = generated_rows(completions, recomputed)

    example = case(prompts, shape, spec)
    metrics = recorder.measure(lp_train, lp_infer, case=example, positions=positions)
    recorder.check_profile(metrics, example)
