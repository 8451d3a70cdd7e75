"""Rollout parity — the training–inference mismatch itself.

The engine samples rollouts and reports the log-probability of each token it sampled; the
backend recomputes those tokens. With identical weights the two agree within the active
profile, whatever the sampling spec (the engine must report raw model logprobs), at rollout
lengths and batch sizes up to the search depth, for RL-shaped batches too. A case seeded
determinism sampled already is judged on that answer (``shared_engine``).
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import generated_rows, prompt_batches, rollout_specs


@given(data=st.data())
def test_rollout_parity(data, shared_engine, backend, model, depth, recorder):
    spec = data.draw(rollout_specs(model, depth), label="sampling")
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec)

    completions = shared_engine.generate(prompts, spec)
    recomputed = backend.recompute([c.sequence for c in completions]).logprobs
    lp_train, lp_infer, positions = generated_rows(completions, recomputed)

    contexts = [c.sequence for c in completions]
    recorder.check_profile(
        recorder.measure(lp_train, lp_infer, positions=positions, contexts=contexts)
    )
