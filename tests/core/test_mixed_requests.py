"""Mixed batches (``Engine.generate_requests``): a request is one-line validated, the guard holds
each answer to its own request, the base implementation serves one ``generate`` batch per
parameter set in request order, and the support audit takes each request under its own spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.engines import Completion, EngineConfig, Request, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.errors import UsageError
from conformance.guard import ProtocolViolation, check_answer
from conformance.support_audit import sampled_batches

PLAIN = SamplingSpec(max_new_tokens=2, seed=1)
TOP_K = SamplingSpec(max_new_tokens=3, top_k=20, seed=2)


def test_a_request_with_n_samples_is_one_line_naming_the_fix():
    with pytest.raises(UsageError, match="n = 1 per request"):
        Request([1, 2], SamplingSpec(n=2))
    with pytest.raises(UsageError, match="top_logprobs >= 0"):
        Request([1, 2], top_logprobs=-1)
    assert Request([1, 2]).prompt == (1, 2) and hash(Request([1, 2])) == hash(Request((1, 2)))


def _answer(prompt, tokens, top=None, reason="length"):
    return Completion(list(prompt), tokens, [-1.0] * len(tokens), top, reason)


@pytest.mark.parametrize(
    ("answers", "problem"),
    [
        ([_answer([5], [1, 2])], "1 completions for 2 requests"),
        ([_answer([5], [1, 2]), _answer([5], [1, 2, 3], [{1: -1.0}] * 3)], "another prompt"),
        ([_answer([5], [1, 2], [{1: -1.0}] * 2), _answer([6], [1, 2, 3])], "did not ask for"),
        ([_answer([5], [1, 2]), _answer([6], [1, 2, 3])], "no top log-prob entries"),
        ([_answer([5], [1, 2]), _answer([6], [1, 2], [{1: -1.0}] * 2)], "max_new_tokens=3"),
    ],
    ids=["count", "prompt", "unasked-top", "missing-top", "own-length"],
)
def test_the_guard_holds_each_answer_to_its_own_request(answers, problem):
    requests = [Request([5], PLAIN), Request([6], TOP_K, top_logprobs=1)]
    right = [_answer([5], [1, 2]), _answer([6], [1, 2, 3], [{1: -1.0}] * 3)]
    check_answer("engine 'e'", "generate_requests", (requests,), right)
    with pytest.raises(ProtocolViolation, match=problem):
        check_answer("engine 'e'", "generate_requests", (requests,), answers)


def test_the_audit_takes_each_truncating_request_under_its_own_spec():
    requests = [Request([5], TOP_K), Request([6], PLAIN), Request([7], TOP_K)]
    answers = [_answer([5], [1, 2, 3]), _answer([6], [1, 2]), _answer([7], [4, 5, 6])]
    ((spec, completions, rows),) = sampled_batches("generate_requests", (requests,), answers)
    assert spec == TOP_K and rows == [0, 2] and completions == [answers[0], answers[2]]
    assert sampled_batches("generate", ([[6]], PLAIN), answers[1:2]) == []


def test_the_base_serves_one_generate_batch_per_parameter_set_in_request_order(
    default_model: Path,
):
    engine = HFGenerateEngine(EngineConfig(model=default_model))
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    requests = [
        Request(prompts[0], PLAIN),
        Request(prompts[1], TOP_K, 3),
        Request(prompts[2], PLAIN),
    ]

    served = engine.generate_requests(requests)

    check_answer("engine 'hf-generate'", "generate_requests", (requests,), served)
    plain = engine.generate([prompts[0], prompts[2]], PLAIN)
    (top,) = engine.generate([prompts[1]], TOP_K, top_logprobs=3)
    assert [c.tokens for c in served] == [c.tokens for c in (plain[0], top, plain[1])]
    assert [c.logprobs for c in served] == [c.logprobs for c in (plain[0], top, plain[1])]
    assert served[1].top_logprobs == top.top_logprobs and served[0].top_logprobs is None


def test_the_guard_checks_requests_given_by_name(default_model: Path):
    from collections import defaultdict

    from conformance.guard import Guarded

    class _Unechoed(HFGenerateEngine):
        def generate_requests(self, requests):
            served = super().generate_requests(requests)
            served[0].prompt = served[0].prompt[1:]
            return served

    engine = Guarded(
        _Unechoed(EngineConfig(model=default_model)),
        kind="engine",
        on_crash=lambda reason: None,
        timing=defaultdict(float),
        deadline_s=None,
    )
    with pytest.raises(ProtocolViolation, match="request 0's completion another prompt"):
        engine.generate_requests(requests=[Request([5, 6], PLAIN)])
