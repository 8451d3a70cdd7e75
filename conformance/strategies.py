"""Hypothesis strategies for conformance properties: token prompts, batch shapes, sampling
specs and precisions. Each accepts plain values or strategies and shrinks towards the simplest
case (short prompts of low token ids, batch size 1, temperature 1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from conformance.dtypes import DTYPE_NAMES
from conformance.engines.base import SamplingSpec
from conformance.errors import UsageError

T = TypeVar("T")

#: default dimensions of sampling specs; the first value of each is what shrinking reaches
NEW_TOKENS = st.integers(1, 16)
TEMPERATURES = st.sampled_from([1.0, 0.7, 0.5, 1.3])
TOP_PS = st.sampled_from([1.0, 0.9, 0.5])
TOP_KS = st.sampled_from([0, 20])
SEEDS = st.integers(0, 2**31 - 1)
#: lengths of repeated-token runs in a sequence; 1 = no repetition
_RUN_LENGTHS = st.sampled_from([1, 2, 4, 8])
PaddingSide = Literal["left", "right"]


@dataclass(frozen=True)
class BatchShape:
    """How a batch is laid out: one length per sequence, and where the padding goes."""

    lengths: tuple[int, ...]
    padding_side: PaddingSide

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "lengths": list(self.lengths),
            "padding_side": self.padding_side,
        }


def _as_strategy(value: T | SearchStrategy[T]) -> SearchStrategy[T]:
    return value if isinstance(value, SearchStrategy) else st.just(value)


def _check_range(name: str, low: int, high: int, floor: int) -> None:
    if low < floor:
        raise UsageError(f"{name}: min {low} < {floor}", f"use a minimum of at least {floor}")
    if high < low:
        raise UsageError(f"{name}: max {high} < min {low}", "make max >= min")


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

    The bulk of the ids comes from one block of bytes (one Hypothesis choice, not one per
    token: drawing token by token cost most of a certify run). Often the sequence is
    made of runs of a repeated token (repetition stresses KV-cache reuse and attention over
    identical keys), and up to four positions are overwritten with vocabulary edges or special
    ids. Shrinks towards ``[min_id] * min_len``.

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
        length = draw(st.integers(min_len, high))
        return _draw_ids(draw, length, vocab_size, min_id, special_ids)

    return build()


def _draw_ids(
    draw: st.DrawFn, length: int, vocab_size: int, min_id: int, special_ids: Sequence[int]
) -> list[int]:
    """``length`` ids as :func:`token_sequences` describes, drawn without building strategies
    per sequence (that construction dominated the cost of a batch)."""
    span = vocab_size - min_id
    width = 2 if span <= 2**16 else 4
    block = draw(st.binary(min_size=width * length, max_size=width * length))
    tokens = [
        min_id + int.from_bytes(block[i : i + width], "little") % span
        for i in range(0, width * length, width)
    ]
    run = draw(_RUN_LENGTHS)
    tokens = [tokens[i - i % run] for i in range(length)]
    markers = sorted({min_id, vocab_size - 1, max(min_id, vocab_size - 2), *special_ids})
    overrides = st.tuples(st.integers(0, length - 1), st.sampled_from(markers))
    for position, token in draw(st.lists(overrides, max_size=4)):
        tokens[position] = token
    return tokens


def batch_shapes(
    *,
    min_batch: int = 1,
    max_batch: int = 8,
    min_len: int = 1,
    max_len: int = 64,
    padding_sides: Sequence[PaddingSide] = ("left", "right"),
) -> SearchStrategy[BatchShape]:
    """Return a strategy for batch layouts: size, ragged lengths, padding side.

    Shrinks towards one sequence of length ``min_len``, padded on the first side given.
    """
    _check_range("batch_shapes batch", min_batch, max_batch, 1)
    _check_range("batch_shapes length", min_len, max_len, 1)
    if not padding_sides:
        raise UsageError("batch_shapes: padding_sides is empty", "pass ('left',) or ('right',)")
    return st.builds(
        BatchShape,
        lengths=st.lists(st.integers(min_len, max_len), min_size=min_batch, max_size=max_batch).map(
            tuple
        ),
        padding_side=st.sampled_from(tuple(padding_sides)),
    )


def token_batches(
    vocab_size: int,
    *,
    shape: BatchShape | SearchStrategy[BatchShape] | None = None,
    special_ids: Sequence[int] = (),
) -> SearchStrategy[tuple[BatchShape, list[list[int]]]]:
    """Return a strategy for ``(shape, prompts)``: prompts of exactly the shape's lengths."""
    shapes = _as_strategy(shape) if shape is not None else batch_shapes()

    @st.composite
    def build(draw: st.DrawFn) -> tuple[BatchShape, list[list[int]]]:
        drawn = draw(shapes)
        prompts = [_draw_ids(draw, n, vocab_size, 0, special_ids) for n in drawn.lengths]
        return drawn, prompts

    return build()


def sampling_specs(
    *,
    max_new_tokens: int | SearchStrategy[int] = NEW_TOKENS,
    temperature: float | SearchStrategy[float] = TEMPERATURES,
    top_p: float | SearchStrategy[float] = TOP_PS,
    top_k: int | SearchStrategy[int] = TOP_KS,
    seed: int | SearchStrategy[int] = SEEDS,
    ignore_eos: bool | SearchStrategy[bool] = True,
) -> SearchStrategy[SamplingSpec]:
    """Return a strategy for sampling specs. Shrinks towards temperature 1, no top-p/top-k."""
    return st.builds(
        SamplingSpec,
        max_new_tokens=_as_strategy(max_new_tokens),
        temperature=_as_strategy(temperature),
        top_p=_as_strategy(top_p),
        top_k=_as_strategy(top_k),
        seed=_as_strategy(seed),
        ignore_eos=_as_strategy(ignore_eos),
    )


def precisions(names: Sequence[str] = DTYPE_NAMES) -> SearchStrategy[str]:
    """Return a strategy for precision names (``float32``, ``bfloat16``, ``float16``)."""
    return st.sampled_from(tuple(names))
