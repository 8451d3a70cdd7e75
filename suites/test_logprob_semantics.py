"""Logprob semantics.

An engine must report the *raw* model log-probability of each sampled token — what the trainer
recomputes — not the *processed* one after temperature scaling or top-k/top-p renormalisation.
Processed logprobs put a log-partition bias into every ratio π_train/π_infer (the vLLM
``logprobs_mode`` pitfall TRL users hit, huggingface/trl#4159; SGLang scales output logprobs by
temperature unless ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``).

The backend recomputes both distributions. The engine is said to report PROCESSED logprobs only
when the evidence beats the plain explanation (log-probs simply wrong from some position on: an
attention window, padding, precision): its values agree with the processed recompute within the
active profile and not with the raw one; every token where they miss the raw value by more than
the profile lets a token differ is one processing moves that far (a miss where processing
changes nothing is plain disagreement); and at those tokens they sit so much closer to the
processed value than a plain error would by chance that chance is ruled out
(:func:`coincidence`). Otherwise the failure says what differs and from which position on.
"""

import math

from hypothesis import given
from hypothesis import strategies as st

from conformance.strategies import sampling_specs
from conformance.suite_support import generated_rows, new_tokens, prompt_batches

#: the chance of a plain error's fitting the processed values at or below which the engine is
#: said to report them: a shrinker tries hundreds of cases, so one in a million
COINCIDENCE = 1e-6


def coincidence(raw, processed, reported, tolerance):
    """The chance that the engine's values (``reported``) fit the processed log-probs as
    closely as they do by plain error: over the tokens processing moves by more than
    ``tolerance`` (the profile's per-token bound), the product of how close each lands to its
    processed value relative to how far processing moved it (an error of about that size lands
    that close with about that chance). 1 where a token misses the raw value by more than
    ``tolerance`` though processing does not move it that far, or sits nearer the raw value than
    the processed one: plain disagreement. Rows are aligned token lists."""
    chance = 1.0
    for raw_row, processed_row, reported_row in zip(raw, processed, reported, strict=True):
        for r, p, e in zip(raw_row, processed_row, reported_row, strict=True):
            moved = abs(p - r)
            if not moved > tolerance:
                if not abs(e - r) <= tolerance:
                    return 1.0
                continue
            # a token the sampler cut has processed log-prob −inf: no fit to it
            if not abs(e - p) < abs(e - r):
                return 1.0
            chance *= abs(e - p) / moved
    return chance


def first_divergence(train, infer, offsets, tolerance):
    """``(row, token, difference)`` of the token at the smallest position (``offsets[row]`` +
    ``token``: a generated token's place in its sequence) whose two log-probs differ by more
    than ``tolerance``; ``None`` where none does."""
    found = None
    for row, (a, b) in enumerate(zip(train, infer, strict=True)):
        for token, (x, y) in enumerate(zip(a, b, strict=True)):
            if not abs(x - y) <= tolerance:  # NaN differs too
                if found is None or offsets[row] + token < offsets[found[0]] + found[1]:
                    found = (row, token, abs(x - y))
                break
    return found


def _check_raw(recorder, profile, backend, completions, processing, what):
    sequences = [c.sequence for c in completions]
    raw, reported, positions = generated_rows(completions, backend.recompute(sequences).logprobs)
    metrics = recorder.measure(raw, reported, positions=positions, contexts=sequences)
    # the processed recompute only names a disagreement: a second whole forward per example
    # that a conformant engine never needs
    if not recorder.violations(raw, reported):
        return
    # a profile with no per-token bound tells no token apart: nothing is named PROCESSED
    tolerance = profile.bounds("logprob_semantics").get("abs_diff_max", math.inf)
    processed, _, _ = generated_rows(
        completions, backend.recompute(sequences, **processing).logprobs
    )
    if (
        not recorder.violations(processed, reported)
        and coincidence(raw, processed, reported, tolerance) <= COINCIDENCE
    ):
        recorder.fail(
            f"engine reports PROCESSED logprobs: at {what} its values match the processed "
            "distribution within the profile and the raw model distribution does not, too "
            f"closely for a plain error (chance below {COINCIDENCE:g}); every ratio "
            "π_train/π_infer is biased — ask the engine for raw logprobs",
            metrics,
        )
    offsets = [len(c.prompt) for c in completions]
    diverged = first_divergence(raw, reported, offsets, tolerance)
    where = ""
    if diverged is not None:
        row, token, difference = diverged
        where = (
            f"the engine's log-probs differ from the raw model distribution from position "
            f"{offsets[row] + token} on (sequence {row}, generated token {token}: "
            f"{difference:.3g} nats; every token measured before it within the per-token bound "
            f"{tolerance:.3g}) at {what}"
        )
    recorder.check_profile(metrics, where=where)


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
def test_raw_logprobs_under_temperature(data, engine, backend, model, depth, profile, recorder):
    temperature = data.draw(st.sampled_from([0.7, 0.5, 1.3]), label="temperature")
    completions = _rollouts(
        data, engine, model, depth, recorder, temperature=temperature, top_p=1.0
    )
    _check_raw(
        recorder,
        profile,
        backend,
        completions,
        {"temperature": temperature},
        f"temperature {temperature}",
    )


@given(data=st.data())
def test_raw_logprobs_under_top_p(data, engine, backend, model, depth, profile, recorder):
    # top-k rides along (one property, not two: the suite's cost is per example); shrinking
    # drops it first, so a failure that needs only top-p says so
    top_k = data.draw(st.sampled_from([0, 5, 20, 50]), label="top_k")
    top_p = data.draw(st.sampled_from([0.5, 0.8, 0.9]), label="top_p")
    completions = _rollouts(
        data, engine, model, depth, recorder, temperature=1.0, top_p=top_p, top_k=top_k
    )
    processing = {"top_p": top_p, "top_k": top_k}
    _check_raw(recorder, profile, backend, completions, processing, f"top_p {top_p}, top_k {top_k}")
