"""The support audit on real rollouts: chunking the recompute changes nothing it finds, a token
the stated sampler cuts is found at its place, and a rollout sampled from other logits is left
to the parity properties."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance import support_audit
from conformance.backends import BackendConfig
from conformance.backends.hf import HFBackend
from conformance.engines import EngineConfig, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.sampling import SamplerOrder


@pytest.fixture(scope="module")
def rollouts(default_model):
    engine = HFGenerateEngine(EngineConfig(model=default_model))
    backend = HFBackend(BackendConfig(model=default_model))
    spec = SamplingSpec(max_new_tokens=12, top_k=3, seed=5)
    prompts = [[5 + i, 40 + 3 * i, 7] for i in range(6)]
    try:
        yield backend, spec, engine.generate(prompts, spec)
    finally:
        engine.close()
        backend.close()


def _plant_least_likely(backend, completions, *, logprob_off_by: float = 0.0):
    """The 2nd rollout's last token replaced by the least likely one, outside any top-3 (an
    earlier one would change the context every later token was sampled in), reported with its
    raw log-prob plus ``logprob_off_by``."""
    logp = backend.next_token_logprobs([completions[1].sequence])[0]
    step = len(completions[1].tokens) - 1
    position = logp[len(completions[1].prompt) - 1 + step]
    worst = int(position.argmin())
    tokens, logprobs = list(completions[1].tokens), list(completions[1].logprobs)
    tokens[step], logprobs[step] = worst, float(position[worst]) + logprob_off_by
    planted = list(completions)
    planted[1] = dataclasses.replace(planted[1], tokens=tokens, logprobs=logprobs)
    return planted, worst, step


def test_chunked_audit_finds_what_one_recompute_finds(rollouts, monkeypatch):
    backend, spec, completions = rollouts
    planted, worst, step = _plant_least_likely(backend, completions)

    def audit():
        return support_audit.audit_rollouts(
            backend, spec, planted, order=SamplerOrder.TOP_K_THEN_TOP_P, margin=1e-4
        )

    whole = audit()
    monkeypatch.setattr(support_audit, "AUDIT_POSITIONS", 16)  # one sequence at a time
    assert audit() == whole
    assert whole.tokens == sum(len(c.tokens) for c in completions)
    assert whole.outside == 1
    assert whole.first == f"completion 1 token {worst} at step {step}"


@pytest.mark.parametrize("off_by", [1e-3, float("nan")])
def test_a_rollout_from_other_logits_is_not_audited(rollouts, off_by):
    """Its reported log-probs differ from the backend's beyond the margin: its tokens were
    sampled from other logits, which the parity properties judge; the sampler is not blamed."""
    backend, spec, completions = rollouts
    planted, _, _ = _plant_least_likely(backend, completions, logprob_off_by=off_by)
    found = support_audit.audit_rollouts(
        backend, spec, planted, order=SamplerOrder.TOP_K_THEN_TOP_P, margin=1e-4
    )
    assert found.outside == 0
    assert found.tokens == sum(len(c.tokens) for c in completions) - len(planted[1].tokens)
    # reported as processed log-probs, the same rollout is audited and found
    processed = support_audit.audit_rollouts(
        backend, spec, planted, order=SamplerOrder.TOP_K_THEN_TOP_P, margin=1e-4,
        raw_logprobs=False,
    )  # fmt: skip
    assert processed.outside == 1


def test_a_session_holds_a_sampled_batch_once_per_check(tmp_path):
    """A seeded rerun samples the same batch again: the session's support property holds it
    once (one backend forward), and holds a batch it has not seen; a new check starts afresh."""
    from conformance.session import HarnessSession
    from conformance.stack import StackSpec

    repo = Path(__file__).resolve().parents[2]
    session = HarnessSession(StackSpec(), seed=7, report_dir=None, command="", rootdir=repo)
    spec = SamplingSpec(max_new_tokens=12, top_k=3, seed=5)
    prompts = [[5 + i, 40 + 3 * i, 7] for i in range(4)]
    try:
        with session.check("determinism", "rerun", "suites/x.py::rerun") as record:
            first = session.engine.generate(prompts, spec)
            again = session.engine.generate(prompts, spec)
            assert [c.tokens for c in again] == [c.tokens for c in first]
            once = sum(len(c.tokens) for c in first)
            assert record.extra["support_tokens"] == once
            assert record.extra["out_of_support_tokens"] == 0
            other = session.engine.generate(prompts, dataclasses.replace(spec, seed=6))
            assert record.extra["support_tokens"] == once + sum(len(c.tokens) for c in other)
        with session.check("determinism", "afresh", "suites/x.py::afresh") as record:
            session.engine.generate(prompts, spec)
            assert record.extra["support_tokens"] == once
    finally:
        session.close()
