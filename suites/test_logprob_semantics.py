"""Logprob semantics.

An engine must report the *raw* model log-probability of each sampled token — what the trainer
recomputes — not the *processed* one after temperature scaling or top-p renormalisation.
Processed logprobs put a log-partition bias into every ratio π_train/π_infer (the
vLLM ``logprobs_mode`` pitfall TRL users hit, huggingface/trl#4159; SGLang scales output
logprobs by temperature unless ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``).
"""

from hypothesis import given
from hypothesis import strategies as st

from conformance.strategies import sampling_specs
from conformance.suite_support import case, generated_rows, prompt_batches

#: mean signed log-ratio (nats) above which top-p renormalisation is declared. Precision noise
#: is symmetric (its signed mean is ~0 even in bf16), while renormalising by the kept mass S < 1
#: raises every logprob by −log S > 0 — at top_p ≤ 0.9 typically tenths of a nat.
TOP_P_BIAS_NATS = 0.02


def _mean_gap(reference, reported, *, signed=False):
    """Mean of (reported − reference), or of its absolute value, over all tokens."""
    gaps = [
        e - r
        for ref_row, rep_row in zip(reference, reported, strict=True)
        for r, e in zip(ref_row, rep_row, strict=True)
    ]
    return sum(gaps if signed else map(abs, gaps)) / len(gaps)


@given(data=st.data())
def test_raw_logprobs_under_temperature(data, engine, backend, model, recorder):
    temperature = data.draw(st.sampled_from([0.7, 0.5, 1.3]), label="temperature")
    spec = data.draw(sampling_specs(temperature=temperature, top_p=1.0, top_k=0), "sampling")
    shape, prompts = data.draw(prompt_batches(model, max_new_tokens=spec.max_new_tokens), "batch")

    completions = engine.generate(prompts, spec)
    sequences = [c.sequence for c in completions]
    raw, reported, positions = generated_rows(completions, backend.recompute(sequences).logprobs)
    scaled, _, _ = generated_rows(
        completions, backend.recompute(sequences, temperature=temperature).logprobs
    )

    example = case(prompts, shape, spec)
    metrics = recorder.measure(raw, reported, case=example, positions=positions)
    gap_raw, gap_scaled = _mean_gap(raw, reported), _mean_gap(scaled, reported)
    if gap_scaled < gap_raw:
        recorder.fail(
            f"engine reports PROCESSED logprobs: at temperature {temperature} they match "
            f"log_softmax(logits/T) (mean |Δ| {gap_scaled:.3g}) rather than the raw model "
            f"distribution (mean |Δ| {gap_raw:.3g}); every ratio π_train/π_infer is biased — ask "
            "the engine for raw logprobs",
            example,
            metrics,
        )
    recorder.check_profile(metrics, example)


@given(data=st.data())
def test_raw_logprobs_under_top_p(data, engine, backend, model, recorder):
    top_p = data.draw(st.sampled_from([0.5, 0.8, 0.9]), label="top_p")
    spec = data.draw(sampling_specs(temperature=1.0, top_p=top_p, top_k=0), "sampling")
    shape, prompts = data.draw(prompt_batches(model, max_new_tokens=spec.max_new_tokens), "batch")

    completions = engine.generate(prompts, spec)
    recomputed = backend.recompute([c.sequence for c in completions]).logprobs
    raw, reported, positions = generated_rows(completions, recomputed)

    example = case(prompts, shape, spec)
    metrics = recorder.measure(raw, reported, case=example, positions=positions)
    bias = _mean_gap(raw, reported, signed=True)
    if bias > TOP_P_BIAS_NATS:
        recorder.fail(
            f"engine reports PROCESSED logprobs: at top_p {top_p} they exceed the raw ones by "
            f"{bias:.3g} nats on average (renormalised over the nucleus); ask the engine for raw "
            "logprobs",
            example,
            metrics,
        )
    recorder.check_profile(metrics, example)
