"""Stop strings keep ids and log-probs aligned.

An engine with a tokenizer can end a rollout once its text contains a stop string (vLLM,
SGLang's ``stop``). The text is cut at the string; the token ids and their log-probabilities
must still be those of the same tokens: every token up to the one that completed the string,
none after it, each with the log-probability the backend recomputes for it. Stop strings are
drawn from the texts of single tokens, so rollouts meet them. An engine that cannot match stop
strings says so (``NotImplementedError``) and the check skips with its reason.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.suite_support import generated_rows, model_tokenizer, prompt_batches, rollout_specs

#: most stop strings in one spec
MAX_STOP_STRINGS = 4


def _stop_texts(tokenizer, vocab_size: int) -> list[str]:
    """Texts of single tokens that a stop string can be: printable, whole characters."""
    texts = {tokenizer.decode([t], skip_special_tokens=True) for t in range(vocab_size)}
    return sorted(t for t in texts if t.strip() and "\ufffd" not in t)


@given(data=st.data())
def test_stop_strings_keep_ids_and_logprobs_aligned(data, engine, backend, model, depth, recorder):
    tokenizer = model_tokenizer(model)
    texts = _stop_texts(tokenizer, model.vocab_size)
    stop = data.draw(
        st.lists(st.sampled_from(texts), min_size=1, max_size=MAX_STOP_STRINGS, unique=True),
        label="stop",
    )
    spec = data.draw(
        rollout_specs(model, depth, ignore_eos=False, stop=tuple(stop)), label="sampling"
    )
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=spec.max_new_tokens), label="batch"
    )
    recorder.case(prompts, shape, spec)

    try:
        completions = engine.generate(prompts, spec)
    except NotImplementedError as exc:
        pytest.skip(str(exc).splitlines()[0])
    for row, completion in enumerate(completions):
        text = tokenizer.decode(completion.tokens, skip_special_tokens=True)
        before = tokenizer.decode(completion.tokens[:-1], skip_special_tokens=True)
        if any(s in before for s in stop):
            recorder.fail(
                f"sequence {row} runs on past a stop string: {before!r} holds one of {stop}"
            )
        stopped_by_text = completion.finish_reason == "stop" and completion.tokens[-1] not in (
            spec.stops_at(model.eos_token_id)
        )
        if stopped_by_text and not any(s in text for s in stop):
            recorder.fail(
                f"sequence {row} says a stop string ended it, and its ids' text {text!r} holds "
                f"none of {stop}: the ids were cut before the text"
            )
    recomputed = backend.recompute([c.sequence for c in completions]).logprobs
    lp_train, lp_infer, positions = generated_rows(completions, recomputed)
    recorder.check_profile(recorder.measure(lp_train, lp_infer, positions=positions))
