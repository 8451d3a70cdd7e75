"""Decode vs prefill.

The log-probabilities an engine reports while decoding token by token over its KV cache match
its own scoring of the finished sequence in one prefill (SGLang tests this as a k3 KL bound),
up to rollouts as long as the search depth reaches, so drift that builds up over many decode
steps or appears past a KV-cache block boundary shows. Sampling at temperature 1 without
truncation, so raw and processed logprobs coincide and any gap is the decode path's own.
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import generated_rows, prompt_batches, rollout_specs


@given(data=st.data())
def test_decode_vs_prefill(data, engine, model, depth, recorder):
    spec = data.draw(
        rollout_specs(model, depth, temperature=1.0, top_p=1.0, top_k=0), label="sampling"
    )
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec)

    completions = engine.generate(prompts, spec)
    contexts = [c.sequence for c in completions]
    lp_prefill, lp_decode, positions = generated_rows(completions, engine.score(contexts))

    sides = ("the engine's prefill", "the engine's decode")
    recorder.check_profile(
        recorder.measure(lp_prefill, lp_decode, positions=positions, sides=sides, contexts=contexts)
    )
