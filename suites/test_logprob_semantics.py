"""Logprob semantics.

An engine must report the *raw* model log-probability of each sampled token — what the trainer
recomputes — not the *processed* one after temperature scaling or top-k/top-p renormalisation.
Processed logprobs put a log-partition bias into every ratio π_train/π_infer (the vLLM
``logprobs_mode`` pitfall TRL users hit, huggingface/trl#4159; SGLang scales output logprobs by
temperature unless ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``).

The backend recomputes both distributions. The engine is said to report PROCESSED logprobs only
when its values agree with the processed recompute within the active profile and not with the
raw one; any other disagreement (padding, a wrong token's log-prob, precision) is reported as
the mismatch it is.
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.strategies import sampling_specs
from conformance.suite_support import generated_rows, new_tokens, prompt_batches


def _check_raw(recorder, backend, completions, processing, what):
    sequences = [c.sequence for c in completions]
    raw, reported, positions = generated_rows(completions, backend.recompute(sequences).logprobs)
    metrics = recorder.measure(raw, reported, positions=positions, contexts=sequences)
    # the processed recompute only names a disagreement: a second whole forward per example
    # that a conformant engine never needs
    if recorder.violations(raw, reported):
        processed, _, _ = generated_rows(
            completions, backend.recompute(sequences, **processing).logprobs
        )
        if not recorder.violations(processed, reported):
            recorder.fail(
                f"engine reports PROCESSED logprobs: at {what} its values match the processed "
                "distribution within the profile and the raw model distribution does not; "
                "every ratio π_train/π_infer is biased — ask the engine for raw logprobs",
                metrics,
            )
    recorder.check_profile(metrics)


def _rollouts(data, engine, model, depth, recorder, **sampling):
    spec = data.draw(
        sampling_specs(max_new_tokens=new_tokens(depth), **{"top_k": 0, **sampling}),
        label="sampling",
    )
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec)
    return engine.generate(prompts, spec)


@given(data=st.data())
def test_raw_logprobs_under_temperature(data, engine, backend, model, depth, recorder):
    temperature = data.draw(st.sampled_from([0.7, 0.5, 1.3]), label="temperature")
    completions = _rollouts(
        data, engine, model, depth, recorder, temperature=temperature, top_p=1.0
    )
    _check_raw(
        recorder, backend, completions, {"temperature": temperature}, f"temperature {temperature}"
    )


@given(data=st.data())
def test_raw_logprobs_under_top_p(data, engine, backend, model, depth, recorder):
    # top-k rides along (one property, not two: the suite's cost is per example); shrinking
    # drops it first, so a failure that needs only top-p says so
    top_k = data.draw(st.sampled_from([0, 5, 20, 50]), label="top_k")
    top_p = data.draw(st.sampled_from([0.5, 0.8, 0.9]), label="top_p")
    completions = _rollouts(
        data, engine, model, depth, recorder, temperature=1.0, top_p=top_p, top_k=top_k
    )
    processing = {"top_p": top_p, "top_k": top_k}
    _check_raw(recorder, backend, completions, processing, f"top_p {top_p}, top_k {top_k}")
