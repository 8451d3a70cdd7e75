"""The guard's protocol check of how a rollout ends: tokens and log-probs alike in number, and
``finish_reason`` as the tokens show it (a stop id last, or ``max_new_tokens`` tokens)."""

from __future__ import annotations

import pytest

from conformance.engines import SamplingSpec
from conformance.engines.base import Completion
from conformance.guard import ProtocolViolation, check_answer

EOS = 1
STOPPING = SamplingSpec(max_new_tokens=4, ignore_eos=False, stop_token_ids=(7,))


def answer(spec: SamplingSpec, tokens: list[int], finish: str) -> None:
    completion = Completion([5], tokens, [-1.0] * len(tokens), finish_reason=finish)
    check_answer("engine 'e'", "generate", ([[5]], spec), [completion], EOS)


@pytest.mark.parametrize(
    ("spec", "tokens", "finish"),
    [
        (STOPPING, [3, 7], "stop"),
        (STOPPING, [3, EOS], "stop"),
        (STOPPING, [3, 4, 5, 6], "length"),
        (SamplingSpec(max_new_tokens=3), [EOS, 7, EOS], "length"),
    ],
)
def test_rollouts_that_end_as_they_say_pass(spec, tokens, finish):
    answer(spec, tokens, finish)


@pytest.mark.parametrize(
    ("spec", "tokens", "finish", "named"),
    [
        (STOPPING, [3, 4], "stop", "the stop token dropped?"),
        (STOPPING, [3, 4], "length", "finish_reason 'length' and max_new_tokens=4"),
        (STOPPING, [7, 3, 4, 5], "length", "past stop id 7"),
        (STOPPING, [3, 4, 5, 6, 7], "stop", "past max_new_tokens=4"),
        (SamplingSpec(max_new_tokens=3), [EOS, 2], "stop", "no stop id"),
        (STOPPING, [3, 7], "eos", "expected 'stop' or 'length'"),
    ],
)
def test_rollouts_that_end_otherwise_are_protocol_violations(spec, tokens, finish, named):
    with pytest.raises(ProtocolViolation, match="completion 0") as raised:
        answer(spec, tokens, finish)
    assert named in str(raised.value)
