"""The counting task: answers follow the rule, rewards are position matches."""

from __future__ import annotations

import random

import pytest

from conformance.errors import UsageError
from conformance.rl.task import LONG_LENGTHS, SHORT_LENGTHS, counting_task, position_reward


@pytest.mark.parametrize("long", [False, True])
def test_answers_count_up_from_the_start_to_the_end_token(long):
    task = counting_task(384, eos_id=1, special_ids=[0, 2], long=long)
    assert not {0, 1, 2} & set(task.alphabet)
    index = {tok: i for i, tok in enumerate(task.alphabet)}
    low, high = LONG_LENGTHS if long else SHORT_LENGTHS
    for problem in task.problems(50, random.Random(0)):
        end, start = problem.prompt
        *answer, eos = problem.target
        assert eos == 1
        assert [index[t] for t in answer] == list(range(index[start] + 1, index[end] + 1))
        assert low <= len(answer) <= high
        assert len(problem.target) + 18 <= task.max_new_tokens


def test_a_vocabulary_too_small_for_long_answers_is_refused():
    with pytest.raises(UsageError, match="alphabet"):
        counting_task(100, eos_id=1, special_ids=[0, 2], long=True)


@pytest.mark.parametrize(
    ("response", "target", "reward"),
    [
        ([5, 6, 1], [5, 6, 1], 1.0),
        ([5, 7, 1], [5, 6, 1], 2 / 3),
        ([5, 6], [5, 6, 1], 2 / 3),  # stopped without EOS
        ([5, 6, 7, 8, 1, 1], [5, 6, 1], 2 / 6),  # ran past the answer
        ([], [5, 1], 0.0),
    ],
)
def test_position_reward(response, target, reward):
    assert position_reward(response, target) == pytest.approx(reward)
