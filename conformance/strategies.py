"""Hypothesis strategies for conformance properties: token prompts, batch shapes (independent
prompts, GRPO groups of one prompt repeated, prompts sharing a system prefix), sampling specs and
precisions. Each accepts plain values or strategies and shrinks towards the simplest case (short
prompts of the lowest token id, one sequence, temperature 1). Sizes are log-uniform
(:func:`log_sizes`) so long cases are reached without dominating a run's time."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from conformance.dtypes import DTYPE_NAMES
from conformance.engines.base import SamplingSpec
from conformance.errors import UsageError

T = TypeVar("T")

#: default dimensions of sampling specs; the first value of each is what shrinking reaches
TEMPERATURES = st.sampled_from([1.0, 0.7, 0.5, 1.3])
TOP_PS = st.sampled_from([1.0, 0.9, 0.5])
TOP_KS = st.sampled_from([0, 20])
SEEDS = st.integers(0, 2**31 - 1)
#: rollouts that run to the length (what shrinking reaches) or stop at a stop id, as RL's do
IGNORE_EOS = st.sampled_from([True, False])
#: most ids besides EOS a drawn spec stops at (see :func:`stop_token_ids`)
MAX_STOP_IDS = 4
#: seeds of a prompt's token ids (see token_sequences)
_ID_SEEDS = st.integers(0, 2**32 - 1)
#: lengths of repeated-token runs in a sequence; 1 = no repetition
RUN_LENGTHS = (1, 2, 4, 8)
_RUN_LENGTHS = st.sampled_from(RUN_LENGTHS)
#: GRPO samples n responses per prompt (n = 8–16 in the seeds), so a rollout batch repeats
#: each prompt n times, next to each other as verl and TRL lay them out
GROUP_SIZES = (2, 4, 8, 16)
PaddingSide = Literal["left", "right"]
#: how a batch's prompts relate: independent; ``grouped`` (each prompt repeated ``group_size``
#: times, GRPO); ``shared-prefix`` (one system prompt of ``prefix_len`` tokens, then each its own
#: suffix: what prefix caching serves). The first is what shrinking reaches.
BatchKind = Literal["independent", "grouped", "shared-prefix"]
BATCH_KINDS: tuple[BatchKind, ...] = ("independent", "grouped", "shared-prefix")


@dataclass(frozen=True)
class BatchShape:
    """How a batch is laid out: one length per sequence, where the padding goes, and how the
    prompts relate (``kind``; ``group_size`` for grouped, ``prefix_len`` for shared-prefix)."""

    lengths: tuple[int, ...]
    padding_side: PaddingSide
    kind: BatchKind = "independent"
    group_size: int = 1
    prefix_len: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "lengths": list(self.lengths),
            "padding_side": self.padding_side,
            "kind": self.kind,
            "group_size": self.group_size,
            "prefix_len": self.prefix_len,
        }


def _as_strategy(value: T | SearchStrategy[T]) -> SearchStrategy[T]:
    return value if isinstance(value, SearchStrategy) else st.just(value)


def _check_range(name: str, low: int, high: int, floor: int) -> None:
    if low < floor:
        raise UsageError(f"{name}: min {low} < {floor}", f"use a minimum of at least {floor}")
    if high < low:
        raise UsageError(f"{name}: max {high} < min {low}", "make max >= min")


#: one :func:`log_sizes` draw in this many is the largest size
TOP_ODDS = 8


@dataclass
class TopCase:
    """The example a property draws at the top sizes (:func:`at_top_sizes`): the extreme it
    reaches where a batch's token budget holds only one of them at a time (``"batch"``: the
    most sequences; ``"length"``: the longest prompts), and whether a drawn batch's prompts
    were held below the longest by that budget (another example must then reach them)."""

    reach: Literal["batch", "length"] = "batch"
    cut_short: bool = False


#: the top-size example being drawn (:func:`at_top_sizes`), if any
_AT_TOP: ContextVar[TopCase | None] = ContextVar("tim_conformance_at_top_sizes", default=None)


def drawing_at_top() -> bool:
    """Whether the running example is drawn at the top sizes (:func:`at_top_sizes`)."""
    return _AT_TOP.get() is not None


@contextmanager
def at_top_sizes(reach: Literal["batch", "length"] = "batch") -> Iterator[TopCase]:
    """Draw the largest case while inside: every :func:`log_sizes` draw gives its top, and a
    sequence whose id seed is the simplest (0, all ``min_id``) takes its ids from a seed of its
    own position in the batch instead.

    Hypothesis's first example makes every choice the simplest one; under this, that example
    is the largest batch of the longest varied prompts and rollouts the strategies allow (within
    the token budget), where the same choices outside give the smallest case. Each property
    runs it once, so a run reaches its depth's top sizes for certain, not in most runs. The
    choices drawn are those made outside, so the example replays and shrinks as usual; its
    sizes stay at the top.

    Where the token budget holds the largest batch only with shorter prompts, the yielded
    :class:`TopCase` says so (``cut_short``), and an example drawn with ``reach="length"``
    reaches the longest prompts instead, in as many sequences as the budget holds.
    """
    case = TopCase(reach)
    token = _AT_TOP.set(case)
    try:
        yield case
    finally:
        _AT_TOP.reset(token)


#: set while a property draws its example in one batch-size bucket (:func:`at_batch_size`)
_BATCH_SIZE: ContextVar[int | None] = ContextVar("tim_conformance_batch_size", default=None)


def batch_buckets(max_batch: int) -> list[int]:
    """The largest size of each power-of-two bucket of batch sizes up to ``max_batch`` (1, 2,
    3–4, 5–8, …, the last one ending at ``max_batch``): kernels switch implementation at such
    thresholds (cuBLAS heuristics, CUDA-graph capture sizes 1, 2, 4, 8, 16, …).

    >>> batch_buckets(32)
    [1, 2, 4, 8, 16, 32]
    """
    _check_range("batch_buckets", 1, max_batch, 1)
    return [*(1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch), max_batch]


def drawing_batch_size() -> int | None:
    """The batch size the running example is drawn at (:func:`at_batch_size`), if any."""
    return _BATCH_SIZE.get()


@contextmanager
def at_batch_size(size: int) -> Iterator[None]:
    """Draw batches of ``size`` sequences while inside (each :func:`batch_shapes` clamps it to
    its own range; a grouped batch holds the most whole groups that fit), with the simplest
    ids seeded from each sequence's position as under :func:`at_top_sizes`. A property run
    once per :func:`batch_buckets` size under this reaches every bucket in every run, where
    log-uniform draws leave some bucket out of about one run in four."""
    token = _BATCH_SIZE.set(size)
    try:
        yield
    finally:
        _BATCH_SIZE.reset(token)


# drawn inside other strategies' draws, once per sequence: a composite built anew each time
# costs Hypothesis a read of its source
@functools.lru_cache(maxsize=4096)
def log_sizes(low: int, high: int) -> SearchStrategy[int]:
    """Return a strategy for integers in ``[low, high]``, spread log-uniformly, with the top.

    One draw in ``TOP_ODDS`` is ``high`` itself, so a run of 20 examples reaches the depth's
    largest size about 14 times in 15 (a length- or batch-dependent bug lives there; the
    example each property runs under :func:`at_top_sizes` reaches it every time). Otherwise a
    ceiling ``low·2^(k+1) − 1`` is drawn uniformly over the octaves k and then a value uniformly
    in ``[low, ceiling]``, so each octave is reached about as often as the one above it and most
    examples stay cheap. The value is drawn from ``low`` up (not from the octave's start), so
    shrinking lowers it to the smallest failing size without first changing the octave. A
    failure first found at the top size may keep ``high``: leaving the top branch lands on the
    size the other two choices hold, and shrinking takes that step only when it still fails.

    >>> log_sizes(1, 128).example()  # doctest: +SKIP
    37
    """
    _check_range("log_sizes", low, high, 1)
    octaves = int(math.log2(high / low)) + 1

    @st.composite
    def build(draw: st.DrawFn) -> int:
        # the same three choices on either branch: Hypothesis ranks shorter choice sequences
        # simpler, so a top branch that drew fewer would be where shrinking ends
        top = draw(st.integers(0, TOP_ODDS - 1)) == TOP_ODDS - 1
        octave = draw(st.integers(0, octaves - 1))
        value = draw(st.integers(low, min(high, (low << (octave + 1)) - 1)))
        return high if top or _AT_TOP.get() is not None else value

    return build()


#: rollout lengths of :func:`sampling_specs` unless given (suites draw theirs from the depth)
NEW_TOKENS = log_sizes(1, 16)


def token_ids(
    vocab_size: int, *, special_ids: Sequence[int] = (), min_id: int = 0
) -> SearchStrategy[int]:
    """Return a strategy for token ids in ``[min_id, vocab_size)``.

    Mixes uniform ids with the vocabulary edges (``min_id``, ``vocab_size − 1``, ``− 2``),
    where engines have been seen to mis-report (SGLang: ids ≥ vocab_size − 1), and the
    special ids. Shrinks towards ``min_id``.

    - vocab_size: the model's vocabulary size.
    - special_ids: bos/eos/pad ids to draw now and then.
    - min_id: lowest id to draw.

    >>> token_ids(384, special_ids=[0, 1, 2]).example()  # doctest: +SKIP
    383
    """
    _check_range("token_ids", min_id, vocab_size - 1, 0)
    edges = sorted({min_id, vocab_size - 1, max(min_id, vocab_size - 2)})
    parts = [st.integers(min_id, vocab_size - 1), st.sampled_from(edges)]
    if special_ids:
        parts.append(st.sampled_from(sorted(set(special_ids))))
    return st.one_of(*parts)


def token_sequences(
    vocab_size: int,
    *,
    min_len: int = 1,
    max_len: int | SearchStrategy[int] = 64,
    special_ids: Sequence[int] = (),
    min_id: int = 0,
) -> SearchStrategy[list[int]]:
    """Return a strategy for one prompt as token ids, ``min_len``..``max_len`` long.

    The length is log-uniform (:func:`log_sizes`). The ids come from a drawn seed (Hypothesis
    caps one example's entropy at 8 KiB, far below a 4,000-token prompt drawn id by id); seed 0
    gives ``min_id`` everywhere, the simplest sequence. Often the sequence is made of runs of a
    repeated token (repetition stresses KV-cache reuse and attention over identical keys), and
    up to four positions are overwritten with vocabulary edges or special ids. Shrinks towards
    ``[min_id] * min_len``.

    - vocab_size / special_ids / min_id: as for :func:`token_ids`.
    - min_len, max_len: length bounds; ``max_len`` may be a strategy.

    >>> token_sequences(384, max_len=8).example()  # doctest: +SKIP
    [17, 17, 17, 383, 2, 2]
    """
    _check_range("token_sequences ids", min_id, vocab_size - 1, 0)

    @st.composite
    def build(draw: st.DrawFn) -> list[int]:
        high = draw(_as_strategy(max_len))
        _check_range("token_sequences length", min_len, high, 1)
        length = draw(log_sizes(min_len, high))
        return _draw_ids(draw, length, vocab_size, min_id, special_ids)

    return build()


def _draw_ids(
    draw: st.DrawFn,
    length: int,
    vocab_size: int,
    min_id: int,
    special_ids: Sequence[int],
    position: int = 0,
) -> list[int]:
    """``length`` ids as :func:`token_sequences` describes; ``position`` is the sequence's
    place in its batch (:func:`at_top_sizes` seeds the simplest ids from it)."""
    varied = _AT_TOP.get() is not None or _BATCH_SIZE.get() is not None
    seed = draw(_ID_SEEDS) or (position + 1 if varied else 0)
    if seed:
        rng = random.Random(seed)
        tokens = rng.choices(range(min_id, vocab_size), k=length)
    else:
        tokens = [min_id] * length
    tokens = in_runs(tokens, draw(_RUN_LENGTHS))
    for position, token in draw(_overrides(length, marker_ids(vocab_size, special_ids, min_id))):
        tokens[position] = token
    return tokens


def marker_ids(
    vocab_size: int, special_ids: Sequence[int] = (), min_id: int = 0
) -> tuple[int, ...]:
    """The ids the strategies draw beside uniform ones: the vocabulary's edges and the special
    ids (``calibrate`` measures sequences of them too)."""
    return tuple(sorted({min_id, vocab_size - 1, max(min_id, vocab_size - 2), *special_ids}))


def in_runs(tokens: Sequence[int], run: int) -> list[int]:
    """``tokens`` with every ``run``-th one repeated over the next ``run`` positions: the
    repetition the strategies draw (``calibrate`` measures prompts made this way too)."""
    return [tokens[i - i % run] for i in range(len(tokens))]


@functools.lru_cache(maxsize=4096)
def _overrides(length: int, markers: tuple[int, ...]) -> SearchStrategy[list[tuple[int, int]]]:
    """Up to four (position, marker id) pairs for a sequence of ``length`` (built once per
    length: sequences draw it one by one)."""
    return st.lists(st.tuples(st.integers(0, length - 1), st.sampled_from(markers)), max_size=4)


def batch_shapes(
    *,
    min_batch: int = 1,
    max_batch: int = 8,
    min_len: int = 1,
    max_len: int = 64,
    padding_sides: Sequence[PaddingSide] = ("left", "right"),
    kinds: Sequence[BatchKind] = BATCH_KINDS,
    max_tokens: int | None = None,
    new_tokens: int = 0,
    group_size: int | None = None,
) -> SearchStrategy[BatchShape]:
    """Return a strategy for batch layouts: size and ragged lengths (log-uniform), padding side,
    and how the prompts relate (``kinds``, see :data:`BatchKind`).

    A grouped batch repeats each of its prompts ``group_size`` times, so its size is a multiple
    of the group; a shared-prefix batch draws one prefix length for all. With ``max_tokens``, a
    batch of n prompts keeps n × (longest prompt + ``new_tokens``) within it: the size is drawn
    first and caps the lengths, so large batches and long prompts are each reached, but not the
    corner of both (an engine splits that into steps of its own token budget anyway). Groups
    are drawn from ``GROUP_SIZES``; a run's own ``group_size`` replaces the larger ones, and the
    largest case (:func:`at_top_sizes`) is then a grouped batch at that size, so every run
    reaches it: as many whole groups as the batch holds, and where the budget then shortens
    their prompts, the longest prompts in as many whole groups as fit (``reach="length"``).
    Shrinks towards one independent sequence of length ``min_len``, padded on the
    first side given.
    """
    _check_range("batch_shapes batch", min_batch, max_batch, 1)
    _check_range("batch_shapes length", min_len, max_len, 1)
    if not padding_sides:
        raise UsageError("batch_shapes: padding_sides is empty", "pass ('left',) or ('right',)")
    if not kinds or not set(kinds) <= set(BATCH_KINDS):
        raise UsageError(f"batch_shapes: kinds {kinds!r}", f"pass some of {BATCH_KINDS}")
    if max_tokens is not None:
        fits = max_tokens // (min_len + new_tokens)
        if fits < min_batch:
            raise UsageError(
                f"batch_shapes: {min_batch} sequences of {min_len} + {new_tokens} tokens exceed "
                f"max_tokens {max_tokens}",
                "raise max_tokens or draw fewer new tokens",
            )
        max_batch = min(max_batch, fits)

    def longest(size: int) -> int:
        """The longest prompt a batch of ``size`` holds; a top-size example held below
        ``max_len`` by the budget is marked so (:class:`TopCase`)."""
        if max_tokens is None:
            return max_len
        length = max(min_len, min(max_len, max_tokens // size - new_tokens))
        at_top = _AT_TOP.get()
        if at_top is not None and length < max_len:
            at_top.cut_short = True
        return length

    if group_size is not None:
        _check_range("batch_shapes group", 1, group_size, 1)
    sizes = GROUP_SIZES if group_size is None else sorted({group_size, *GROUP_SIZES} - {
        g for g in GROUP_SIZES if g > group_size})  # fmt: skip
    groups = [g for g in sizes if -(-min_batch // g) * g <= max_batch]
    possible = {
        "independent": True,
        "grouped": bool(groups),
        "shared-prefix": max_batch >= 2 and max_len >= 2,
    }
    usable = tuple(k for k in kinds if possible[k]) or ("independent",)

    def sized(drawn: int, low: int, high: int, per: int = 1) -> int:
        forced = _BATCH_SIZE.get()
        return drawn if forced is None else min(max(forced // per, low), high)

    @st.composite
    def build(draw: st.DrawFn) -> BatchShape:
        at_top = _AT_TOP.get()
        top_group = group_size if at_top is not None and group_size in groups else None
        kind = "grouped" if top_group and "grouped" in usable else draw(st.sampled_from(usable))
        side = draw(st.sampled_from(tuple(padding_sides)))
        longest_first = at_top is not None and at_top.reach == "length"
        if kind == "grouped":
            group = top_group or draw(st.sampled_from(groups))
            low, high = max(1, -(-min_batch // group)), max_batch // group
            if top_group and longest_first:
                # the run's longest prompt in whole groups of the run's size: as many as fit
                per_group = group * (max_len + new_tokens)
                fits = high if max_tokens is None else max_tokens // per_group
                prompts = max(low, min(high, fits))
            else:
                prompts = sized(draw(log_sizes(low, high)), low, high, group)
            top = longest(prompts * group)
            distinct = [draw(log_sizes(min_len, top)) for _ in range(prompts)]
            lengths = tuple(n for n in distinct for _ in range(group))
            return BatchShape(lengths, side, "grouped", group_size=group)
        size = sized(draw(log_sizes(min_batch, max_batch)), min_batch, max_batch)
        if longest_first and max_tokens is not None:
            size = max(min_batch, min(size, max_tokens // (max_len + new_tokens)))
        top = longest(size)
        if kind == "shared-prefix" and top >= 2:
            prefix = draw(log_sizes(1, top - 1))
            suffixes = [draw(log_sizes(max(1, min_len - prefix), top - prefix))
                        for _ in range(size)]  # fmt: skip
            return BatchShape(
                tuple(prefix + n for n in suffixes), side, "shared-prefix", prefix_len=prefix
            )
        lengths = tuple(draw(log_sizes(min_len, top)) for _ in range(size))
        return BatchShape(lengths, side)

    return build()


def token_batches(
    vocab_size: int,
    *,
    shape: BatchShape | SearchStrategy[BatchShape] | None = None,
    special_ids: Sequence[int] = (),
    chat_prompts: Sequence[Sequence[int]] = (),
) -> SearchStrategy[tuple[BatchShape, list[list[int]]]]:
    """Return a strategy for ``(shape, prompts)``: prompts of exactly the shape's lengths,
    repeated within groups and sharing the prefix as the shape's kind says.

    - chat_prompts: natural-language prompts rendered by the model's chat template
      (:func:`conformance.chat_prompts.rendered_prompts`). Where given, each drawn sequence is
      either random ids, as without them (what shrinking reaches), or chat text
      (:func:`chat_text`): the rendered prompts run together and cut to the sequence's length
      so that one of them, ending at the assistant's turn, ends it, so a trained model
      continues a prompt like those it was trained on. Lengths, groups and shared prefixes
      stay as the shape says.
    """
    shapes = _as_strategy(shape) if shape is not None else batch_shapes()
    rendered = tuple(tuple(p) for p in chat_prompts)
    if any(not p or not all(0 <= t < vocab_size for t in p) for p in rendered):
        raise UsageError(
            f"token_batches: a chat prompt is empty or has ids outside [0, {vocab_size})",
            "render chat_prompts with the model's own tokenizer",
        )
    picks = st.integers(0, len(rendered) - 1) if rendered else None

    @st.composite
    def build(draw: st.DrawFn) -> tuple[BatchShape, list[list[int]]]:
        drawn = draw(shapes)

        def ids(n: int, position: int) -> list[int]:
            drawn_ids = _draw_ids(draw, n, vocab_size, 0, special_ids, position)
            if picks is None:
                return drawn_ids
            # the same choices on either branch: Hypothesis ranks shorter choice sequences
            # simpler, so chat text drawn with fewer would be where shrinking ends
            chat, pick = draw(st.booleans()), draw(picks)
            return chat_text(rendered, pick, n) if chat else drawn_ids

        if drawn.kind == "grouped":
            distinct = [ids(n, i) for i, n in enumerate(drawn.lengths[:: drawn.group_size])]
            return drawn, [list(p) for p in distinct for _ in range(drawn.group_size)]
        if drawn.kind == "shared-prefix":
            prefix = ids(drawn.prefix_len, 0)
            return drawn, [
                prefix + ids(n - drawn.prefix_len, i + 1) for i, n in enumerate(drawn.lengths)
            ]
        return drawn, [ids(n, i) for i, n in enumerate(drawn.lengths)]

    return build()


def chat_text(rendered: Sequence[Sequence[int]], last: int, length: int) -> list[int]:
    """``length`` ids of chat text: the rendered prompts ``rendered[last]``, and before it
    ``rendered[last − 1]``, ``rendered[last − 2]``, … (cyclically) as far as needed, run
    together and cut at the start, so ``rendered[last]`` (or its end, where it is longer than
    ``length``) ends the sequence.

    >>> chat_text([[1, 2], [3, 4, 5]], 1, 4)
    [2, 3, 4, 5]
    """
    pieces: list[Sequence[int]] = []
    total, index = 0, last
    while total < length:
        piece = rendered[index % len(rendered)]
        pieces.append(piece)
        total += len(piece)
        index -= 1
    ids = [t for piece in reversed(pieces) for t in piece]
    return ids[len(ids) - length :]


def stop_token_ids(
    vocab_size: int, *, eos_token_id: int | None = None, max_ids: int = MAX_STOP_IDS
) -> SearchStrategy[tuple[int, ...]]:
    """Return a strategy for the ids that end a rollout: the model's EOS and up to ``max_ids``
    distinct ids drawn uniformly from the vocabulary, sorted. Shrinks towards EOS alone.

    A model rarely samples its EOS, least of all a random one (the default model: 0.4 % of
    sampled tokens), so stops come mostly from the drawn ids, as RL stacks add the chat
    template's end-of-turn ids to EOS: with the default model each id ends about one
    128-token rollout in eight, so batches mix rollouts that stopped early with rollouts
    capped at the length.
    """
    _check_range("stop_token_ids", 1, vocab_size, 1)
    eos = () if eos_token_id is None else (eos_token_id,)
    drawn = st.lists(st.integers(0, vocab_size - 1), max_size=max_ids, unique=True)
    return drawn.map(lambda ids: tuple(sorted({*eos, *ids})))


def sampling_specs(
    *,
    max_new_tokens: int | SearchStrategy[int] = NEW_TOKENS,
    temperature: float | SearchStrategy[float] = TEMPERATURES,
    top_p: float | SearchStrategy[float] = TOP_PS,
    top_k: int | SearchStrategy[int] = TOP_KS,
    seed: int | SearchStrategy[int] = SEEDS,
    ignore_eos: bool | SearchStrategy[bool] = True,
    stop_token_ids: Sequence[int] | SearchStrategy[Sequence[int]] = (),
    stop: Sequence[str] | SearchStrategy[Sequence[str]] = (),
) -> SearchStrategy[SamplingSpec]:
    """Return a strategy for sampling specs. Shrinks towards temperature 1, no top-p/top-k,
    and (with ``ignore_eos`` a strategy such as :data:`IGNORE_EOS`) fixed-length rollouts.

    - stop_token_ids: the ids that end the rollouts that do not ignore EOS
      (:func:`stop_token_ids` draws them); a spec ignoring EOS stops at nothing. Under
      :func:`at_top_sizes` the simplest choice, ``ignore_eos``, runs every rollout to the
      length: the top-size case is the longest one (a stop there would cut the very tokens it
      is run for); the drawn examples stop.
    - stop: stop strings of those rollouts (engines with a tokenizer match them).
    """
    parts = (max_new_tokens, temperature, top_p, top_k, seed, ignore_eos)
    fields = [_as_strategy(p) for p in parts]
    stops = _as_strategy(stop_token_ids)
    texts = _as_strategy(stop)

    @st.composite
    def build(draw: st.DrawFn) -> SamplingSpec:
        new, temp, p, k, drawn_seed, ignore = (draw(f) for f in fields)
        return SamplingSpec(
            max_new_tokens=new,
            temperature=temp,
            top_p=p,
            top_k=k,
            seed=drawn_seed,
            ignore_eos=ignore,
            stop_token_ids=() if ignore else tuple(draw(stops)),
            stop=() if ignore else tuple(draw(texts)),
        )

    return build()


def precisions(names: Sequence[str] = DTYPE_NAMES) -> SearchStrategy[str]:
    """Return a strategy for precision names (``float32``, ``bfloat16``, ``float16``)."""
    return st.sampled_from(tuple(names))


__all__ = [
    "BATCH_KINDS",
    "GROUP_SIZES",
    "IGNORE_EOS",
    "MAX_STOP_IDS",
    "NEW_TOKENS",
    "RUN_LENGTHS",
    "SEEDS",
    "TEMPERATURES",
    "TOP_KS",
    "TOP_ODDS",
    "TOP_PS",
    "BatchKind",
    "BatchShape",
    "PaddingSide",
    "TopCase",
    "at_batch_size",
    "at_top_sizes",
    "batch_buckets",
    "batch_shapes",
    "chat_text",
    "drawing_at_top",
    "drawing_batch_size",
    "in_runs",
    "log_sizes",
    "marker_ids",
    "precisions",
    "sampling_specs",
    "stop_token_ids",
    "token_batches",
    "token_ids",
    "token_sequences",
]
