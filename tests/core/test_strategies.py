"""The Hypothesis strategies: bounds, shapes, validation, and what failures shrink to."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from conformance.depth import CPU_BATCH_WORK, DEPTHS, forward_weights
from conformance.engines import SamplingSpec
from conformance.errors import UsageError
from conformance.recorder import one_example_at_batch_size, run_at_top
from conformance.strategies import (
    BATCH_KINDS,
    GROUP_SIZES,
    IGNORE_EOS,
    at_top_sizes,
    batch_buckets,
    batch_shapes,
    chat_text,
    log_sizes,
    precisions,
    sampling_specs,
    stop_token_ids,
    token_batches,
    token_ids,
    token_sequences,
)
from conformance.suite_support import new_tokens, prompt_batches, rollout_specs

VOCAB = 384
#: drawing realistic sizes is the point here; a loaded CI machine must not turn it into a
#: deadline or health-check failure
SLOW_DRAWS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW_DRAWS
@given(token_sequences(VOCAB, min_len=2, max_len=40, special_ids=[0, 1, 2]))
def test_sequences_stay_in_bounds(sequence):
    assert 2 <= len(sequence) <= 40
    assert all(0 <= t < VOCAB for t in sequence)


@SLOW_DRAWS
@given(token_batches(VOCAB, shape=batch_shapes(max_batch=5, min_len=1, max_len=30)))
def test_batches_have_exactly_their_shape(batch):
    shape, prompts = batch
    assert [len(p) for p in prompts] == list(shape.lengths)
    assert 1 <= shape.batch_size <= 5 and shape.padding_side in ("left", "right")


@SLOW_DRAWS
@given(log_sizes(3, 2048))
def test_log_sizes_stay_in_bounds(size):
    assert 3 <= size <= 2048


def test_log_sizes_reach_every_octave_and_shrink_to_the_low_end():
    for octave in range(1, 12):
        find(log_sizes(1, 2048), lambda n, o=octave: n.bit_length() == o)
    assert find(log_sizes(5, 300), lambda n: True) == 5
    # a failure first drawn at the top may keep it (see log_sizes); from anywhere else it
    # shrinks to the smallest failing size
    assert find(log_sizes(5, 300), lambda n: n > 100) in (101, 300)
    assert find(log_sizes(5, 300), lambda n: 100 < n < 300) == 101


@SLOW_DRAWS
@given(token_batches(VOCAB, shape=batch_shapes(max_batch=32, min_len=2, max_len=200)))
def test_rl_shaped_batches_repeat_and_share_as_their_kind_says(batch):
    shape, prompts = batch
    assert [len(p) for p in prompts] == list(shape.lengths) and shape.kind in BATCH_KINDS
    if shape.kind == "grouped":
        assert shape.group_size in GROUP_SIZES and shape.batch_size % shape.group_size == 0
        groups = [
            prompts[i : i + shape.group_size] for i in range(0, len(prompts), shape.group_size)
        ]
        assert all(all(p == g[0] for p in g) for g in groups)
    if shape.kind == "shared-prefix":
        prefix = prompts[0][: shape.prefix_len]
        assert all(p[: shape.prefix_len] == prefix and len(p) > shape.prefix_len for p in prompts)


@pytest.mark.parametrize("name", DEPTHS)
def test_each_depth_reaches_its_largest_sizes(name):
    depth = DEPTHS[name]
    limit = depth.prompt_limit(4096, depth.max_new_tokens)
    shapes = batch_shapes(
        max_batch=depth.max_batch, max_len=limit, max_tokens=depth.max_batch_tokens
    )
    find(shapes, lambda s: s.batch_size == depth.max_batch)
    find(shapes, lambda s: max(s.lengths) == limit)
    find(sampling_specs(max_new_tokens=log_sizes(1, depth.max_new_tokens)),
         lambda s: s.max_new_tokens == depth.max_new_tokens)  # fmt: skip
    for kind in BATCH_KINDS:
        find(shapes, lambda s, k=kind: s.kind == k and s.batch_size >= 8)


def _top_examples(depth, context=4096):
    """The examples ``run_at_top`` draws for a rollout property at ``depth``, between a drawn
    example before and one after: (spec, shape, prompts) each."""
    model = SimpleNamespace(vocab_size=VOCAB, max_position_embeddings=context, special_token_ids=[])
    new = depth.max_new_tokens
    seen = []

    @settings(max_examples=1, database=None, deadline=None)
    @given(data=st.data())
    def draw(data):
        spec = data.draw(sampling_specs(max_new_tokens=new_tokens(depth)))
        seen.append((spec, *data.draw(prompt_batches(model, depth, max_new_tokens=new))))

    draw()
    run_at_top(draw, draw)
    draw()
    return seen


@pytest.mark.parametrize(
    "depth",
    [
        DEPTHS["quick"],
        DEPTHS["deep"],
        # SmolLM2-135M's budget on a CPU: the batch of 32 holds only one-token prompts
        DEPTHS["quick"].within_cost(147_750_912, 8192),
    ],
    ids=["quick", "deep", "quick-costly-model"],
)
def test_the_examples_run_at_the_top_reach_the_largest_batch_and_the_longest_prompt(depth):
    """Hypothesis's first example makes the simplest choices: the smallest case when drawn,
    the largest (prompts of varied ids) in the example a property runs at the top. Where the
    token budget holds the largest batch only with shorter prompts (deep, a costly model),
    one more example reaches the longest prompts in as many sequences as the budget holds."""
    new, budget = depth.max_new_tokens, depth.max_batch_tokens
    smallest, *tops, drawn = _top_examples(depth)
    assert smallest[1].lengths == (1,) and drawn[1].lengths == (1,)  # the context is as it was
    size = min(depth.max_batch, budget // (1 + new))
    prompt = depth.prompt_limit(4096, new + 1)
    longest = min(prompt, budget // size - new)
    spec, shape, prompts = tops[0]
    assert shape.lengths == (longest,) * size and spec.max_new_tokens == new
    if longest > 1:  # one-token prompts of random ids may repeat
        assert len({tuple(p) for p in prompts}) == size and all(len(set(p)) > 1 for p in prompts)
    if longest == prompt:
        assert len(tops) == 1
        return
    assert len(tops) == 2
    spec, shape, prompts = tops[1]
    assert shape.lengths == (prompt,) * max(1, budget // (prompt + new))
    assert spec.max_new_tokens == new and all(len(set(p)) > 1 for p in prompts)


def test_a_costly_model_draws_within_a_budget_that_still_reaches_every_limit():
    """On a CPU a model's batches hold about ``CPU_BATCH_WORK`` of forward pass, but never too
    few tokens to reach the largest batch or the longest sequence; the embedded models, an
    option's budget and the deep depth's corner-free budget stay as they are."""
    quick, deep = DEPTHS["quick"], DEPTHS["deep"]
    smollm2 = forward_weights(hidden_size=576, num_layers=30, vocab_size=49_152)
    embedded = forward_weights(hidden_size=64, num_layers=2, vocab_size=384)
    costed = quick.within_cost(smollm2, 8192)
    assert costed.max_batch_tokens == 32 * (1 + 128) and costed.budget == "model cost"
    assert "sized to the model's cost" in costed.describe()
    assert quick.within_cost(embedded, 4096) == quick
    ci_shape = quick.with_run_shape(max_prompt_len=48, max_new_tokens=24, max_batch=4)
    assert ci_shape.within_cost(smollm2, 8192) == ci_shape  # its corner is within the cost
    assert deep.within_cost(smollm2, 8192) == deep  # 64 one-token prompts + 2,048 exceed it
    mid = quick.within_cost(CPU_BATCH_WORK // 10_000, 4096)
    assert mid.max_batch_tokens == 10_000
    given = quick.with_run_shape(max_batch_tokens=65_536)
    assert given.within_cost(smollm2, 8192) == given and given.budget == "option"
    grouped = quick.with_run_shape(max_prompt_len=2600, max_new_tokens=600, group_size=8)
    assert grouped.within_cost(smollm2, 8192).max_batch_tokens == 8 * (2600 + 600)


@SLOW_DRAWS
@given(
    st.integers(0, 64).flatmap(
        lambda new: st.tuples(
            st.just(new),
            batch_shapes(max_batch=64, min_len=2, max_len=500, max_tokens=4096, new_tokens=new),
        )
    )
)
def test_a_token_budget_bounds_batch_times_longest_sequence(drawn):
    new_tokens, shape = drawn
    assert shape.batch_size * (max(shape.lengths) + new_tokens) <= 4096


def test_under_a_token_budget_size_and_length_each_reach_their_top():
    shapes = batch_shapes(max_batch=64, max_len=1000, max_tokens=4096)
    find(shapes, lambda s: s.batch_size == 64)
    find(shapes, lambda s: max(s.lengths) == 1000)
    with pytest.raises(UsageError, match="max_tokens"):
        batch_shapes(min_batch=4, min_len=100, max_len=200, max_tokens=300)


def test_vocabulary_edges_repeats_and_specials_are_reached():
    find(token_sequences(VOCAB, max_len=30), lambda s: VOCAB - 1 in s)
    find(token_sequences(VOCAB, max_len=30, special_ids=[7]), lambda s: 7 in s)
    find(token_sequences(VOCAB, max_len=30), lambda s: len(s) >= 8 and len(set(s)) == 1)
    find(token_ids(VOCAB, special_ids=[7]), lambda t: t == VOCAB - 2)


#: a failure first found at the top size may keep it (``log_sizes``): from 150 random starts, a
#: length-dependent failure shrank to length 3 from 116 and stayed at 50 from 34. Shrinking is
#: held here from one fixed start, so that CI does not draw that split anew each run
FIXED_START = settings(derandomize=True, database=None)


def test_failures_shrink_to_short_low_sequences():
    shortest = find(token_sequences(VOCAB, max_len=50), lambda s: len(s) >= 3, settings=FIXED_START)
    assert shortest == [0, 0, 0]
    shape, prompts = find(
        token_batches(VOCAB, shape=batch_shapes(max_batch=6)),
        lambda b: b[0].batch_size >= 2,
        settings=FIXED_START,
    )
    assert shape.lengths == (1, 1) and prompts == [[0], [0]]


def test_sampling_specs_shrink_to_plain_sampling_and_accept_values():
    assert find(sampling_specs(), lambda s: True) == SamplingSpec(max_new_tokens=1, seed=0)
    spec = find(sampling_specs(temperature=0.7, top_p=0.9), lambda s: True)
    assert (spec.temperature, spec.top_p) == (0.7, 0.9)
    assert find(precisions(), lambda p: True) == "float32"


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: token_ids(0), "token_ids"),
        (lambda: batch_shapes(min_batch=0), "batch_shapes batch"),
        (lambda: batch_shapes(min_len=5, max_len=2), "batch_shapes length"),
        (lambda: batch_shapes(padding_sides=()), "padding_sides"),
        (lambda: token_batches(VOCAB, chat_prompts=[[5], [VOCAB]]), "token_batches"),
        (lambda: token_batches(VOCAB, chat_prompts=[[]]), "token_batches"),
    ],
)
def test_bad_arguments_are_named_when_the_strategy_is_built(build, named):
    with pytest.raises(UsageError, match=named):
        build()


def test_bad_lengths_are_named_when_drawn():
    with pytest.raises(UsageError, match="token_sequences length"):
        find(token_sequences(VOCAB, min_len=5, max_len=st.just(2)), lambda s: True)


@SLOW_DRAWS
@given(st.data())
def test_scored_prompts_leave_the_position_an_engine_generates_into(data):
    # vLLM scores a prompt through one generated token: a prompt of the full context fails there
    model = SimpleNamespace(max_position_embeddings=16, vocab_size=VOCAB, special_token_ids=[0])
    new_tokens = data.draw(st.integers(0, 8))
    _, prompts = data.draw(prompt_batches(model, DEPTHS["deep"], max_new_tokens=new_tokens))
    assert max(len(p) for p in prompts) + new_tokens <= 15


@pytest.mark.parametrize("name", DEPTHS)
def test_every_run_reaches_every_batch_size_bucket(name):
    """The examples run at each bucket's size, as the plugin runs them after the drawn ones,
    put a batch in every power-of-two bucket up to the depth's largest, whatever was drawn."""
    depth = DEPTHS[name]
    model = SimpleNamespace(vocab_size=VOCAB, max_position_embeddings=4096, special_token_ids=[])
    sizes = []

    @settings(max_examples=3, database=None, deadline=None)
    @given(data=st.data())
    def draw(data):
        shape, prompts = data.draw(prompt_batches(model, depth, min_len=2))
        assert shape.batch_size == len(prompts)
        sizes.append(len(prompts))

    draw()
    drawn = len(sizes)
    for size in batch_buckets(depth.max_batch):
        with one_example_at_batch_size(draw, size):
            draw()
    buckets = {(n - 1).bit_length() for n in sizes[drawn:]}
    assert buckets == set(range(depth.max_batch.bit_length())), sizes
    # outside, drawing is as before: the first example is the simplest, one sequence
    after = len(sizes)
    draw()
    assert sizes[after] == 1


@pytest.mark.parametrize(
    ("top", "sizes"), [(1, [1]), (12, [1, 2, 4, 8, 12]), (64, [1, 2, 4, 8, 16, 32, 64])]
)
def test_batch_buckets_end_at_the_largest_size(top, sizes):
    assert batch_buckets(top) == sizes


MODEL = SimpleNamespace(vocab_size=VOCAB, eos_token_id=1)


def test_rollout_specs_shrink_to_fixed_length_and_reach_stops_with_eos_among_them():
    depth = DEPTHS["quick"]
    simplest = find(rollout_specs(MODEL, depth), lambda s: True)
    assert simplest == SamplingSpec(max_new_tokens=1, seed=0)
    stopping = find(rollout_specs(MODEL, depth), lambda s: len(s.stop_token_ids) > 2)
    assert not stopping.ignore_eos and 1 in stopping.stop_token_ids
    # the smallest stopping spec stops at EOS alone
    assert find(rollout_specs(MODEL, depth), lambda s: not s.ignore_eos).stop_token_ids == (1,)


@SLOW_DRAWS
@given(st.data())
def test_a_drawn_spec_that_ignores_eos_has_no_stops(data):
    spec = data.draw(sampling_specs(ignore_eos=IGNORE_EOS, stop_token_ids=stop_token_ids(VOCAB)))
    assert not spec.ignore_eos or spec.stop_token_ids == ()


def test_the_example_at_the_top_runs_every_rollout_to_the_length():
    """The top-size example is the longest case: a stop there would cut the tokens it is run
    for (a defect at position 211 went unseen when it stopped); the drawn examples stop."""
    depth = DEPTHS["quick"]
    with at_top_sizes():
        top = find(rollout_specs(MODEL, depth), lambda s: True)
    assert top.ignore_eos and top.stop_token_ids == ()
    assert top.max_new_tokens == depth.max_new_tokens


def test_a_spec_that_ignores_eos_takes_no_stops():
    with pytest.raises(UsageError, match="ignore_eos=False"):
        SamplingSpec(stop_token_ids=[5])
    spec = SamplingSpec(ignore_eos=False, stop_token_ids=[7, 5])
    assert spec.stop_token_ids == (7, 5) and spec.stops_at(1) == {1, 5, 7}
    assert SamplingSpec().stops_at(1) == frozenset()
    assert find(sampling_specs(stop_token_ids=(5,)), lambda s: True).stop_token_ids == ()


@pytest.mark.parametrize("group", [3, 8, 12])
def test_a_run_shape_is_reached_by_the_examples_at_the_top(group):
    """A run's own shape replaces the depth's limits, and the examples each property runs at
    the top reach all of it, in grouped batches at its group size: its batch in whole groups,
    and its longest prompt and rollout (the token budget grows to hold one such group)."""
    depth = DEPTHS["quick"].with_run_shape(
        max_prompt_len=2600, max_new_tokens=600, max_batch=24, group_size=group
    )
    assert depth.max_batch_tokens >= group * (2600 + 600)
    model = SimpleNamespace(vocab_size=VOCAB, max_position_embeddings=4096, special_token_ids=[])
    seen = []

    @settings(max_examples=1, database=None, deadline=None)
    @given(data=st.data())
    def draw(data):
        spec = data.draw(sampling_specs(max_new_tokens=new_tokens(depth)))
        seen.append((spec, *data.draw(prompt_batches(model, depth, max_new_tokens=600))))

    run_at_top(draw, draw)
    (spec, most, _), (long_spec, longest, _) = seen
    assert spec.max_new_tokens == long_spec.max_new_tokens == 600
    for shape in (most, longest):
        assert shape.kind == "grouped" and shape.group_size == group
    assert most.batch_size == group * (24 // group) and max(most.lengths) < 2600
    assert max(longest.lengths) == 2600
    fits = depth.max_batch_tokens // (group * 3200)
    assert longest.batch_size == group * max(1, min(24 // group, fits))


def test_a_run_group_size_replaces_the_larger_default_groups():
    shapes = batch_shapes(max_batch=32, max_len=8, group_size=6)
    seen = set()
    find(shapes, lambda s: s.kind == "grouped" and s.group_size == 6)
    for _ in range(200):
        shape = shapes.example()
        if shape.kind == "grouped":
            seen.add(shape.group_size)
    assert seen <= {2, 4, 6}


def test_a_run_shape_keeps_the_depth_where_it_names_nothing():
    quick = DEPTHS["quick"]
    assert quick.with_run_shape() == quick
    shaped = quick.with_run_shape(max_new_tokens=600)
    assert (shaped.max_new_tokens, shaped.max_prompt_len, shaped.max_batch) == (600, 512, 32)
    with pytest.raises(UsageError, match=r"--group-size 16 .*fix: pass --max-batch 16"):
        quick.with_run_shape(max_batch=8, group_size=16)


#: a small ChatML-like template over the embedded tokenizer's own special tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model(default_model, tmp_path_factory):
    """The embedded model with a chat template written into its tokenizer folder."""
    import shutil

    from conformance.models import inspect_model

    folder = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(default_model, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return inspect_model(folder)


def test_chat_text_runs_the_rendered_prompts_together_ending_with_the_chosen_one():
    rendered = [[1, 2], [3, 4, 5]]
    assert chat_text(rendered, 1, 4) == [2, 3, 4, 5]
    assert chat_text(rendered, 1, 2) == [4, 5]
    # before the first comes the last again: 1 2 | 3 4 5 | 1 2, cut to 6
    assert chat_text(rendered, 0, 6) == [2, 3, 4, 5, 1, 2]
    assert chat_text(rendered, 1, 0) == []


def test_a_model_folder_says_whether_it_has_a_chat_template(default_model, chat_model):
    from conformance.models import inspect_model

    assert chat_model.chat_template and not inspect_model(default_model).chat_template


def test_chat_prompts_are_the_corpus_rendered_up_to_the_assistants_turn(chat_model):
    from conformance.chat_prompts import CORPUS, SYSTEM_PROMPTS, chat_prompts, rendered_prompts
    from conformance.suite_support import model_tokenizer

    tokenizer = model_tokenizer(chat_model)
    rendered = rendered_prompts(tokenizer)
    assert len(rendered) == 2 * len(CORPUS)
    text = f"<|bos|>user\n{CORPUS[0]}<|eos|>\n<|bos|>assistant\n"
    assert list(rendered[0]) == tokenizer.encode(text, add_special_tokens=False)
    system = f"<|bos|>system\n{SYSTEM_PROMPTS[0]}<|eos|>\n"
    assert tokenizer.decode(rendered[len(CORPUS)]) == system + text
    assert find(chat_prompts(tokenizer), lambda p: True) == list(rendered[0])
    with pytest.raises(UsageError, match="no chat template"):
        rendered_prompts(SimpleNamespace(chat_template=None))


def test_with_a_chat_template_drawn_prompts_mix_in_the_rendered_corpus(chat_model):
    """A drawn batch mixes prompts that end with a whole rendered corpus prompt (the model then
    answers it) with random ids; lengths, groups and shared prefixes are as the shape says."""
    from conformance.chat_prompts import rendered_prompts
    from conformance.suite_support import model_tokenizer

    rendered = [list(p) for p in rendered_prompts(model_tokenizer(chat_model))]
    batches = prompt_batches(chat_model, DEPTHS["quick"], min_len=2, max_batch=8, max_len=200)

    def ends_a_chat_prompt(prompt):
        return any(len(prompt) >= len(r) and prompt[-len(r) :] == r for r in rendered)

    @settings(max_examples=20, database=None, deadline=None, derandomize=True)
    @given(batches)
    def draw(batch):
        shape, prompts = batch
        assert [len(p) for p in prompts] == list(shape.lengths)
        if shape.kind == "grouped":
            for i in range(0, len(prompts), shape.group_size):
                assert all(p == prompts[i] for p in prompts[i : i + shape.group_size])
        if shape.kind == "shared-prefix":
            assert all(p[: shape.prefix_len] == prompts[0][: shape.prefix_len] for p in prompts)

    draw()
    find(
        batches,
        lambda b: any(map(ends_a_chat_prompt, b[1])) and not all(map(ends_a_chat_prompt, b[1])),
    )


def test_with_a_chat_template_the_simplest_and_the_top_examples_are_as_before(chat_model):
    """Random ids stay the simplest choice: the smallest case shrinks to what it did, and the
    example at the top still reaches the depth's largest batch of its longest prompts."""
    depth = DEPTHS["quick"]
    plain = SimpleNamespace(
        vocab_size=chat_model.vocab_size,
        max_position_embeddings=chat_model.max_position_embeddings,
        special_token_ids=chat_model.special_token_ids,
    )
    tops = []
    for model in (plain, chat_model):
        assert find(prompt_batches(model, depth), lambda b: True)[1] == [[0]]

        @settings(max_examples=1, database=None, deadline=None)
        @given(data=st.data())
        def draw(data):
            tops.append(data.draw(prompt_batches(model, depth, max_new_tokens=16)))  # noqa: B023

        run_at_top(draw, draw)
    (plain_shape, plain_prompts), (chat_shape, chat_prompts) = tops
    assert chat_shape == plain_shape and chat_prompts == plain_prompts
    assert max(chat_shape.lengths) == min(
        depth.prompt_limit(chat_model.max_position_embeddings, 17),
        depth.max_batch_tokens // chat_shape.batch_size - 16,
    )


def test_a_run_shape_the_model_cannot_hold_is_refused_and_caps_its_calibration():
    quick = DEPTHS["quick"]
    # the depth's own limits are clamped to a short context, never refused; they calibrate as
    # the depth does
    quick.check_fits(256)
    assert quick.calibration_cap(256) is None
    shaped = quick.with_run_shape(max_prompt_len=48, max_new_tokens=24, max_batch=4)
    shaped.check_fits(73)
    with pytest.raises(UsageError, match=r"needs 73 positions; the model has 72"):
        shaped.check_fits(72)
    assert shaped.calibration_cap(4096) == (4, 48, 24)
    # a shape past the depth's limits calibrates as the depth does (and shares its cache)
    assert (
        quick.with_run_shape(max_prompt_len=2600, max_new_tokens=600).calibration_cap(4096) is None
    )
