"""Hypothesis as the harness runs it (``conformance.plugin.hypothesis_settings``): set inside
the run, and what it was before once the run ends."""

from __future__ import annotations

import pytest
from hypothesis import Phase, core, settings
from hypothesis.internal.conjecture import engine as conjecture_engine

from conformance.plugin import hypothesis_settings
from conformance.stack import StackSpec

SPEC = StackSpec(examples=7, shrink_seconds=3.5)


def _state() -> tuple[object, ...]:
    current = settings()
    return (
        settings.get_current_profile_name(),
        core.global_force_seed,
        conjecture_engine.MAX_SHRINKING_SECONDS,
        current.max_examples,
        current.deadline,
        current.phases,
    )


def test_the_harness_settings_hold_inside_the_run_and_are_restored_after(monkeypatch):
    monkeypatch.setattr(core, "global_force_seed", None)
    before = _state()
    with hypothesis_settings(SPEC, examples=True) as seed:
        current = settings()
        # a seed drawn and forced, so the report records the one every example comes from
        assert core.global_force_seed == seed is not None
        assert current.max_examples == 7 and current.deadline is None
        assert Phase.explain not in current.phases and not current.derandomize
        assert conjecture_engine.MAX_SHRINKING_SECONDS == 3.5
    assert _state() == before


@pytest.mark.parametrize("examples", [True, False])
def test_a_given_seed_is_kept_and_an_explicit_profile_keeps_its_examples(monkeypatch, examples):
    monkeypatch.setattr(core, "global_force_seed", 1234)
    loaded = settings().max_examples
    with hypothesis_settings(SPEC, examples=examples) as seed:
        assert seed == core.global_force_seed == 1234
        assert settings().max_examples == (7 if examples else loaded)
    assert core.global_force_seed == 1234 and settings().max_examples == loaded
