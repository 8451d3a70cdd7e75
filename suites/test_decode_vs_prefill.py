"""Decode vs prefill.

The log-probabilities an engine reports while decoding token by token over its KV cache match
its own scoring of the finished sequence in one prefill (SGLang tests this as a k3 KL bound).
Sampling at temperature 1 without truncation, so raw and processed logprobs coincide and any
gap is the decode path's own.
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.strategies import sampling_specs
from conformance.suite_support import case, generated_rows, prompt_batches


@given(data=st.data())
def test_decode_vs_prefill(data, engine, model, recorder):
    spec = data.draw(sampling_specs(temperature=1.0, top_p=1.0, top_k=0), label="sampling")
    shape, prompts = data.draw(prompt_batches(model, max_new_tokens=spec.max_new_tokens), "batch")

    completions = engine.generate(prompts, spec)
    prefill = engine.score([c.sequence for c in completions])
    lp_prefill, lp_decode, positions = generated_rows(completions, prefill)

    example = case(prompts, shape, spec)
    metrics = recorder.measure(lp_prefill, lp_decode, case=example, positions=positions)
    recorder.check_profile(metrics, example)
