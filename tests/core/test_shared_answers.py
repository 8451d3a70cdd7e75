"""The engine's answers shared between checks making the same request (``shared_engine``), on a
real session over the embedded model's hf-generate engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.engines import SamplingSpec
from conformance.session import HarnessSession
from conformance.shared_answers import request_key
from conformance.stack import StackSpec
from conformance.weights import read_weights

REPO = Path(__file__).resolve().parents[2]
SPEC = SamplingSpec(max_new_tokens=12, top_k=3, seed=5)
PROMPTS = [[5 + i, 40 + 3 * i, 7] for i in range(4)]


@pytest.fixture
def session(tmp_path):
    session = HarnessSession(StackSpec(), seed=7, report_dir=tmp_path, command="", rootdir=REPO)
    yield session
    session.close()


def _engine_seconds(session: HarnessSession) -> float:
    return session.stack.timing["engine_s"]


def _events(session: HarnessSession, kind: str) -> list[dict]:
    lines = (session.report_dir / "results.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_a_request_an_earlier_check_made_is_answered_once_per_check(session):
    with session.check("determinism", "first", "suites/a.py::first"):
        sampled = session.shared_engine.generate(PROMPTS, SPEC)
        scored = session.shared_engine.score([c.sequence for c in sampled])
        # the check that asked first gets the engine again when it asks again
        before = _engine_seconds(session)
        session.shared_engine.generate(PROMPTS, SPEC)
        assert _engine_seconds(session) > before
    with session.check("rollout_parity", "second", "suites/b.py::second"):
        before = _engine_seconds(session)
        taken = session.shared_engine.generate(PROMPTS, SPEC)
        taken_scores = session.shared_engine.score([c.sequence for c in sampled])
        assert _engine_seconds(session) == before, "the engine was asked again"
        assert [(c.tokens, c.logprobs) for c in taken] == [(c.tokens, c.logprobs) for c in sampled]
        assert taken_scores == scored
        # a replay in the same check (Hypothesis shrinking a failure) asks the engine
        session.shared_engine.generate(PROMPTS, SPEC)
        assert _engine_seconds(session) > before
        # another request is the engine's to answer
        before = _engine_seconds(session)
        session.shared_engine.generate(PROMPTS, SamplingSpec(max_new_tokens=12, top_k=3, seed=6))
        assert _engine_seconds(session) > before
    shared = _events(session, "shared_answer")
    assert [(e["nodeid"], e["method"], e["asked_by"]) for e in shared] == [
        ("suites/b.py::second", "generate", "suites/a.py::first"),
        ("suites/b.py::second", "score", "suites/a.py::first"),
    ]


def test_nothing_is_shared_once_the_engine_took_new_weights(session):
    with session.check("determinism", "first", "suites/a.py::first"):
        session.shared_engine.generate(PROMPTS, SPEC)
    # the model's own weights, pushed as a weight sync pushes new ones
    session.engine.load_weights(read_weights(session.spec.model_dir()))
    with session.check("rollout_parity", "second", "suites/b.py::second"):
        before = _engine_seconds(session)
        session.shared_engine.generate(PROMPTS, SPEC)
        assert _engine_seconds(session) > before
    assert _events(session, "shared_answer") == []


def test_a_request_key_tells_requests_apart():
    assert request_key("generate", (PROMPTS, SPEC)) == request_key(
        "generate", ([list(p) for p in PROMPTS], SPEC)
    )
    others = [
        ("score", (PROMPTS, SPEC)),
        ("generate", (PROMPTS[:3], SPEC)),
        ("generate", ([[*PROMPTS[0][:2], 8], *PROMPTS[1:]], SPEC)),
        ("generate", (PROMPTS, SamplingSpec(max_new_tokens=12, top_k=3, seed=6))),
    ]
    assert len({request_key("generate", (PROMPTS, SPEC)), *(request_key(*o) for o in others)}) == 5
