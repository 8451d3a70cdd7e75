"""The support audit on real rollouts: chunking the recompute changes nothing it finds, and a
token the stated sampler cuts is found at its place."""

from __future__ import annotations

import dataclasses

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


def test_chunked_audit_finds_what_one_recompute_finds(rollouts, monkeypatch):
    backend, spec, completions = rollouts
    # the 2nd rollout's last token replaced by the least likely one: outside any top-3 (an
    # earlier one would change the context every later token was sampled in)
    logp = backend.next_token_logprobs([completions[1].sequence])[0]
    step = len(completions[1].tokens) - 1
    worst = int(logp[len(completions[1].prompt) - 1 + step].argmin())
    planted = list(completions)
    tokens = list(planted[1].tokens)
    tokens[step] = worst
    planted[1] = dataclasses.replace(planted[1], tokens=tokens)

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
