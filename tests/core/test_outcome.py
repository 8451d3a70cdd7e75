"""How a check's ending is classified: every form of violation is a fail, only a crash an error."""

from __future__ import annotations

from hypothesis.errors import FlakyFailure

from conformance.errors import EngineCrashed
from conformance.outcome import ProfileViolation, PropertyFailure, classify


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as a test raises it."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_bound_violation_is_a_fail_with_its_message():
    outcome = classify(raised(ProfileViolation("rollout_parity: abs_diff_max = 0.1 > 0.01")))
    assert outcome.status == "fail" and outcome.message.startswith("rollout_parity: abs_diff_max")


def test_several_failures_are_one_fail_led_by_the_finding_and_listing_the_others():
    group = ExceptionGroup(
        "two",
        [raised(ProfileViolation("abs_diff_max = 1 > 0")), raised(PropertyFailure("PROCESSED"))],
    )
    outcome = classify(group)
    assert outcome.status == "fail" and outcome.message.startswith("PROCESSED")
    assert "1 other failure(s): ProfileViolation: abs_diff_max" in outcome.message


def test_a_result_that_changes_on_a_rerun_is_a_non_deterministic_fail():
    flaky = FlakyFailure("Inconsistent", [raised(ProfileViolation("abs_diff_max = 1 > 0"))])
    outcome = classify(flaky)
    assert outcome.status == "fail" and outcome.message.startswith("non-deterministic: ")


def test_a_crash_is_an_error_on_one_line_and_never_called_non_deterministic():
    crash = raised(EngineCrashed("engine 'x' died in generate(): boom", "see its log"))
    alone = classify(crash)
    assert (alone.status, alone.crashed) == ("error", True) and "\n" not in alone.message
    # a violation whose replay crashed stays a fail, without the determinism claim
    mixed = classify(FlakyFailure("Inconsistent", [raised(ProfileViolation("k = 1 > 0")), crash]))
    assert mixed.status == "fail" and not mixed.message.startswith("non-deterministic")
