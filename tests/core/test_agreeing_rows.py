"""``conformance.suite_support.agreeing_rows``: two engines' rollouts of the same requests are
compared only over the tokens both sampled alike (the weight-sync suite's fresh engine against
the synced one)."""

from __future__ import annotations

from conformance.engines import Completion
from conformance.suite_support import agreeing_rows


def _completion(tokens: list[int], logprobs: list[float]) -> Completion:
    return Completion(prompt=[1, 2], tokens=tokens, logprobs=logprobs)


def test_rows_stop_where_the_sampled_tokens_first_differ() -> None:
    ours = [
        _completion([5, 6, 7], [-0.1, -0.2, -0.3]),
        _completion([5, 6], [-0.4, -0.5]),
        _completion([9], [-0.6]),
    ]
    theirs = [
        _completion([5, 8, 7], [-0.15, -2.0, -0.3]),
        _completion([5, 6, 4], [-0.45, -0.55, -0.7]),
        _completion([3], [-0.9]),
    ]
    mine, other = agreeing_rows(ours, theirs)
    # the first differing token's own log-prob is of another token: left out
    assert mine == [[-0.1], [-0.4, -0.5], []]
    assert other == [[-0.15], [-0.45, -0.55], []]
