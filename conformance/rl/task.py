"""A synthetic, verifiable task on token ids: count up from a start token to an end token.

The prompt is ``[e, s]`` with ``s < e`` in an ordered alphabet of token ids; the correct answer is
``s+1, s+2, …, e`` followed by EOS, so the answer length is ``e − s`` (variable) plus EOS. One rule
produces every answer token (``next(x) = EOS if x == e else x + 1``), so a tiny model learns it
after a short supervised warm start, and ``--long`` answers (≥ 128 tokens) use the same rule —
needed because the gradient error from mismatch grows like T² (lr-scheduling Theorem 3.1).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from conformance.errors import UsageError

#: answer lengths (EOS excluded) of the short and the long setting
SHORT_LENGTHS = (2, 8)
LONG_LENGTHS = (128, 160)
#: alphabet tokens beyond the longest answer, so start tokens vary
ALPHABET_SLACK = 16
#: the fewest extra tokens a response may run past the longest answer
SURGE_ROOM = 18


@dataclass(frozen=True)
class Problem:
    prompt: list[int]
    #: the correct response, EOS included
    target: list[int]


@dataclass(frozen=True)
class CountingTask:
    """Count-up problems over ``alphabet`` (ordered token ids), answers of ``lengths`` tokens."""

    alphabet: tuple[int, ...]
    eos_id: int
    lengths: tuple[int, int]

    def __post_init__(self) -> None:
        low, high = self.lengths
        if not 1 <= low <= high:
            raise UsageError(f"answer lengths {self.lengths}", "use 1 <= min <= max")
        if len(self.alphabet) < high + 2:
            raise UsageError(
                f"alphabet of {len(self.alphabet)} tokens cannot hold {high}-token answers",
                f"use a model with at least {high + 2} ordinary tokens",
            )

    @property
    def max_new_tokens(self) -> int:
        """Room past the longest answer (EOS included) for a length surge to show: 18 tokens or
        half the answer, whichever is more (short: 27 = 3×; long: 241, cheap enough on CPU)."""
        longest = self.lengths[1] + 1
        return longest + max(SURGE_ROOM, longest // 2)

    def problems(self, n: int, rng: random.Random) -> list[Problem]:
        out = []
        for _ in range(n):
            length = rng.randint(*self.lengths)
            start = rng.randrange(len(self.alphabet) - length)
            answer = list(self.alphabet[start + 1 : start + length + 1])
            prompt = [self.alphabet[start + length], self.alphabet[start]]
            out.append(Problem(prompt=prompt, target=[*answer, self.eos_id]))
        return out


def counting_task(
    vocab_size: int, eos_id: int, special_ids: Sequence[int], *, long: bool = False
) -> CountingTask:
    """The task for a model: the alphabet is the first ordinary (non-special) token ids."""
    lengths = LONG_LENGTHS if long else SHORT_LENGTHS
    size = lengths[1] + ALPHABET_SLACK
    special = {*special_ids, eos_id}
    alphabet = tuple(i for i in range(vocab_size) if i not in special)[:size]
    return CountingTask(alphabet=alphabet, eos_id=eos_id, lengths=lengths)


def position_reward(response: Sequence[int], target: Sequence[int]) -> float:
    """Fraction of positions that match: ``#{t : r_t = y_t} / max(|r|, |y|)``.

    Partial credit keeps group rewards varied (GRPO needs reward spread within a group); a
    response that runs past the answer is penalised through the denominator.
    """
    matches = sum(r == y for r, y in zip(response, target, strict=False))
    return matches / max(len(response), len(target))
