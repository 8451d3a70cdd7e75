"""Ctrl-C and SIGTERM held across a call into an engine's event loop
(``conformance/engines/_interrupts.py``), delivered to the harness's handler once it returns."""

from __future__ import annotations

import os
import signal
import time

import pytest

from conformance.engines._interrupts import interrupts_held
from conformance.guard import Terminated, sigterm_as_interrupt


def _signalled() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    # a handler runs between bytecodes of the main thread: give it some
    time.sleep(0.05)


def test_a_sigterm_inside_the_block_ends_the_run_once_the_block_ends() -> None:
    reached = []
    with sigterm_as_interrupt() as taken, pytest.raises(Terminated), interrupts_held():
        _signalled()
        reached.append("the call's end")
    assert reached == ["the call's end"] and taken == ["SIGTERM"]


def test_a_second_sigterm_inside_the_block_ends_the_run_at_once() -> None:
    """The call may be hung: a second signal is not held."""
    reached = []
    with sigterm_as_interrupt() as taken, pytest.raises(Terminated), interrupts_held():
        _signalled()
        _signalled()
        reached.append("the call's end")
    assert reached == [] and taken == ["SIGTERM"]


def test_the_handlers_are_back_after_the_block() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with interrupts_held():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before
