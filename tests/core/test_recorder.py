"""The recorder: failure messages name the side that produced a NaN/inf log-prob; the pool
holds each token measured in one context once."""

from __future__ import annotations

import math

import pytest

from conformance.outcome import ProfileViolation
from conformance.profiles import load_profile
from conformance.recorder import CheckRecord, Recorder


@pytest.fixture
def held() -> Recorder:
    recorder = Recorder(load_profile("fp32"), log=lambda **_: None, replay=lambda n: f"pytest {n}")
    recorder.current = CheckRecord(suite="determinism", name="t", nodeid="t")
    return recorder


@pytest.mark.parametrize(
    ("sides", "bad", "named"),
    [
        (None, "train", "the backend's (lp_train) log-prob is -inf at sequence 1, token 2"),
        (None, "infer", "the engine's (lp_infer) log-prob is -inf at sequence 1, token 2"),
        (("the engine's first run's", "the engine's rerun's"), "infer",
         "the engine's rerun's log-prob is -inf at sequence 1, token 2"),
    ],
)  # fmt: skip
def test_a_nonfinite_log_prob_is_blamed_on_its_side(held, sides, bad, named):
    good = [[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]]
    broken = [[-1.0, -2.0, -3.0], [-1.0, -2.0, -math.inf]]
    train, infer = (broken, good) if bad == "train" else (good, broken)
    metrics = held.measure(train, infer, **({"sides": sides} if sides else {}))
    with pytest.raises(ProfileViolation) as failure:
        held.check_profile(metrics)
    assert named in str(failure.value)
    assert ("lp_train" in str(failure.value)) == (sides is None and bad == "train")


def test_a_token_scored_again_in_the_same_context_is_pooled_once(held):
    """A GRPO group (one prompt 8 times) scored by a batch-invariant engine, replayed once as
    Hypothesis replays examples: 16 copies of one sequence's errors. Pooled as 16 they would
    make |Σ log ρ|/√n 4 × (√16) what the one sequence measures, with no bias at all."""
    import torch

    from conformance.metrics import mismatch_metrics

    generator = torch.Generator().manual_seed(0)
    sequence = [int(t) for t in torch.randint(3, 384, (200,), generator=generator)]
    train = -torch.rand(199, generator=generator, dtype=torch.float64) * 10
    infer = train + 1e-3 * torch.randn(199, generator=generator, dtype=torch.float64)
    alone = mismatch_metrics(train[None], infer[None], torch.ones(1, 199, dtype=torch.bool))
    for contexts, copies in ((None, 16), ([sequence] * 8, 1)):
        held.current = CheckRecord(suite="prefill_parity", name="t", nodeid="t")
        for _ in range(2):
            measured = held.measure([train] * 8, [infer] * 8, contexts=contexts)
            # the example itself is measured over every row it holds
            assert measured["log_ratio_sum_per_sqrt_tokens"] == pytest.approx(
                alone["log_ratio_sum_per_sqrt_tokens"] * 8**0.5
            )
        assert held.current.tokens() == 199 * copies
        assert held.current.pooled()["log_ratio_sum_per_sqrt_tokens"] == pytest.approx(
            alone["log_ratio_sum_per_sqrt_tokens"] * copies**0.5
        )


def test_a_shared_prefix_is_pooled_once_and_what_follows_it_is_kept(held):
    held.current = CheckRecord(suite="prefill_parity", name="t", nodeid="t")
    prefix = [5, 6, 7, 8]
    contexts = [[*prefix, 9, 10], [*prefix, 11, 12, 13]]
    rows = [[-1.0] * (len(c) - 1) for c in contexts]
    held.measure(rows, rows, contexts=contexts)
    assert held.current.tokens() == 3 + 2 + 3


def test_a_row_longer_than_its_context_is_a_one_line_usage_error(held):
    from conformance.errors import UsageError

    with pytest.raises(UsageError, match="its context of 2 tokens does not hold them"):
        held.measure([[-1.0, -2.0, -3.0]], [[-1.0, -2.0, -3.0]], contexts=[[4, 5]])


def test_a_conversation_pools_the_tokens_at_its_turns(held):
    held.current = CheckRecord(suite="multi_turn", name="t", nodeid="t")
    conversation = [5, 6, 7, 50, 51, 8, 9]  # prompt, turn, reply, turn
    turns = [[-1.0, -2.0], [-3.0, -4.0]]
    row = [v for turn in turns for v in turn]
    for _ in range(2):  # replayed: pooled once
        held.measure([row], [row], contexts=[conversation], scored_at=[[3, 4, 5, 6]])
    assert held.current.tokens() == 4
    held.measure([row], [row], contexts=[[*conversation[:5], 10, 11]], scored_at=[[3, 4, 5, 6]])
    assert held.current.tokens() == 6  # the second turn follows another reply


def _watched(recorder: Recorder, test):
    test.hypothesis.inner_test = recorder.watched(test.hypothesis.inner_test)
    return test


def _property(recorder: Recorder, ran: list[int], fails=lambda token, ran: False):
    """A property whose case is one token of three, drawn with a choice the case does not
    hold, so Hypothesis draws each case again from other choices; ``fails(token, ran)`` says
    whether the stack fails this time (``ran``: the tokens run before)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, database=None, derandomize=True)
    @given(data=st.data())
    def prop(data):
        token = data.draw(st.integers(0, 2))
        data.draw(st.integers(0, 1000))
        recorder.case([[token]])
        failing = fails(token, ran)
        ran.append(token)
        assert not failing

    return _watched(recorder, prop)


def test_a_case_the_check_ran_and_passed_is_not_run_again():
    """The example ends at ``case`` for a case that passed: the stack runs once per case, and
    the log says what was skipped."""
    logged: list[dict] = []
    recorder = Recorder(load_profile("fp32"), log=lambda **e: logged.append(e), replay=str)
    recorder.current = CheckRecord(suite="rollout_parity", name="t", nodeid="t")
    ran: list[int] = []
    _property(recorder, ran)()
    record = recorder.current
    assert len(ran) == len(set(ran)) == len(record.passed_cases) == 3
    # Hypothesis ran more examples than there are cases: the rest were logged as repeats
    assert sum(e["event"] == "repeated_case" for e in logged) >= 1


def test_once_a_check_fails_every_example_runs(held):
    """A stack that fails on case 2, and on case 1 from its second run: once case 2 has failed,
    case 1 runs again when shrinking draws it, fails, and is the case reported; skipped as
    passed, the shrunk failure would stay at 2."""
    ran: list[int] = []
    with pytest.raises(AssertionError):
        _property(held, ran, fails=lambda token, ran: token == 2 or (token in ran and token == 1))()
    assert ran.index(1) < ran.index(2) and ran.count(1) >= 2
    assert held.current.failures and ran[-1] == 1
