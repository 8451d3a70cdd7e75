"""The recorder's failure messages name the side that produced a NaN/inf log-prob."""

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
