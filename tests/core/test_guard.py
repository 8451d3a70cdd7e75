"""SIGTERM handling in the guard: an interrupt Python would drop is raised by the next call."""

from __future__ import annotations

import gc
import os
import signal

import pytest

from conformance.backends import BACKENDS, BackendConfig
from conformance.guard import Guarded, Terminated, sigterm_as_interrupt


def _terminate_during_collection(phase: str, info: dict) -> None:
    # what happened in CI: the signal arrived while Hypothesis's gc callback ran
    if phase == "start":
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_landing_in_a_gc_callback_ends_the_run_at_the_next_guarded_call(default_model):
    backend = Guarded(
        BACKENDS.get("hf")(BackendConfig(model=default_model)),
        kind="backend",
        on_crash=lambda reason: None,
        timing={"backend_s": 0.0},
        deadline_s=None,
    )
    notes: list[str] = []
    try:
        with sigterm_as_interrupt(lambda: notes.append("noted")) as taken:
            gc.callbacks.append(_terminate_during_collection)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(_terminate_during_collection)
            # the collection returned: the interrupt was not raised where it would be dropped
            assert taken == ["SIGTERM"] and notes == ["noted"]
            with pytest.raises(Terminated, match="SIGTERM"):
                backend.recompute([[1, 2, 3]])
            # raised once: the run's own shutdown may still call the component
            assert backend.recompute([[1, 2, 3]]).logprobs
    finally:
        backend.close()


def test_a_sigterm_in_ordinary_code_raises_where_it_lands():
    with sigterm_as_interrupt() as taken, pytest.raises(Terminated, match="SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        # the handler runs between bytecodes, before this loop can end
        for _ in range(10**7):
            pass
    assert taken == ["SIGTERM"]
