"""Engine knobs as property dimensions.

Scheduling and caching settings are meant to change speed, not numbers. Each engine declares its
knobs and the values to try (``Engine.knobs()``; vLLM: chunked prefill and its chunk size, prefix
caching, max_num_seqs, eager vs compiled; SGLang: radix cache, chunked prefill size,
max_running_requests). Every value runs in one of at most three variant engines, each holding
several knobs at once (``conformance.knobs.cover``). A variant scores the same sequences as the
session's engine, and samples rollouts that the session's engine rescores, within the active
profile. A variant that keeps its prefix cache on samples its rollouts twice, so that the second
pass reads its prompts from the cache: a cache hit must not change logprobs beyond the profile (one
with the cache off samples them once: a second pass would only repeat the first, which the
determinism suite checks). A variant that fails replays its minimal case on the session's engine
first (the control: a case the unmodified engine fails too is the engine's defect, reported as
such, not a knob's), then on engines holding parts of its knobs, so the failure names the knob.
A rollout a variant cannot sample (vLLM on CPU cannot seed a prefill its budget splits into
chunks) leaves that example scored only, and the passing check says how many did.
"""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.knobs import MAX_VARIANTS, cover, smallest_failing, with_requirements
from conformance.outcome import ProfileViolation, first_line
from conformance.suite_support import (
    caches_prefixes,
    generated_rows,
    prompt_batches,
    rollout_specs,
)


def compare(
    reference: Any, variant: Any, prompts: list[list[int]], spec: Any, unsampled: list[str]
) -> list[tuple]:
    """(lp_train, lp_infer, positions) of the variant against the session's engine: the
    variant's scores of ``prompts`` (no ``spec``), or its rollouts rescored, twice where it
    keeps a prefix cache the second pass reads. A rollout the variant cannot sample adds the
    engine's reason to ``unsampled``."""
    if spec is None:
        return [(reference.score(prompts), variant.score(prompts), None)]
    rows = []
    for _ in range(2 if caches_prefixes(variant) else 1):
        try:
            completions = variant.generate(prompts, spec)
        except NotImplementedError as exc:
            unsampled.append(first_line(exc))
            break
        rows.append(generated_rows(completions, reference.score([c.sequence for c in completions])))
    return rows


@pytest.mark.parametrize("index", range(MAX_VARIANTS), ids=lambda index: f"variant{index}")
def test_knobs_keep_logprobs(index, tim, engine, model, depth, recorder):
    variants = cover(engine.knobs())
    if not variants:
        pytest.skip(f"engine {engine.name!r} declares no knobs")
    if index >= len(variants):
        pytest.skip(f"engine {engine.name!r} holds its knobs' values in {len(variants)} variants")
    knobs = variants[index]
    recorder.describe(knobs=knobs)
    variant = tim.engine_variant(**knobs)
    #: the example that ran last: Hypothesis's shrunk one, once it has found a failure
    last: dict[str, Any] = {}
    #: why each rollout the variant could not sample was not (scoring is still checked)
    unsampled: list[str] = []
    rollouts = 0

    def check(prompts, shape, spec):
        nonlocal rollouts
        last.update(prompts=prompts, shape=shape, spec=spec)
        recorder.case(prompts, shape, spec, knobs=knobs)
        rollouts += spec is not None
        for lp_train, lp_infer, positions in compare(engine, variant, prompts, spec, unsampled):
            recorder.check_profile(recorder.measure(lp_train, lp_infer, positions=positions))

    @given(data=st.data())
    def knobs_keep_logprobs(data):
        shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
        check(sequences, shape, None)
        spec = data.draw(rollout_specs(model, depth), label="sampling")
        shape, prompts = data.draw(
            prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
        )
        check(prompts, shape, spec)

    try:
        recorder.run(knobs_keep_logprobs)
    except ProfileViolation as violation:
        found = first_line(violation).partition(": ")[2]

        def fails(started):
            rows = compare(engine, started, last["prompts"], last["spec"], [])
            return any(recorder.violations(t, i, per_example=True) for t, i, _ in rows)

        if fails(engine):
            # the control: the engine with no knob changed fails the same case, so the defect is
            # the engine's own (a knob it ignores changes nothing) and no knob is blamed
            recorder.case(last["prompts"], last["shape"], last["spec"], knobs={})
            recorder.fail(
                f"the engine itself, no knob changed, fails this case: {found} (an engine "
                f"defect, not a knob's; variant {knobs} fails it too)",
                breach=violation.breach,
            )

        def part_fails(part):
            return fails(tim.engine_variant(**with_requirements(part, engine.knobs())))

        culprit = smallest_failing(knobs, part_fails)
        recorder.case(last["prompts"], last["shape"], last["spec"], knobs=culprit)
        named = ", ".join(f"{k}={v}" for k, v in culprit.items())
        recorder.fail(
            f"{named} changes logprobs: {found} (variant {knobs})", breach=violation.breach
        )
    if unsampled:
        recorder.remark(
            f"{len(unsampled)} of {rollouts} rollouts not sampled by this variant (scored only); "
            f"the engine says, of the last: {unsampled[-1]}"
        )
