"""KV budgets as engine options (``capabilities.kv_budget_option``): what each adapter turns the
budget into, and the test engine that preempts within one — no vLLM or SGLang started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.engines import ENGINES, EngineConfig, SamplingSpec
from conformance.engines import _sglang_common as sglang_common
from conformance.engines import _vllm_common as vllm_common
from conformance.errors import UsageError


def test_engines_declare_the_option_bounding_their_kv_cache():
    from conformance.engines.sglang import SGLangEngine
    from conformance.engines.vllm import VLLMEngine

    assert VLLMEngine.capabilities.kv_budget_option == "kv_cache_tokens"
    assert SGLangEngine.capabilities.kv_budget_option == "max_total_tokens"
    # hf-generate's cache grows with its batch: no budget, and the suite skips
    assert ENGINES.get("hf-generate").capabilities.kv_budget_option is None


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # two 128-token CPU blocks and the block pool's null block
        ({"kv_cache_tokens": "256"}, {"num_gpu_blocks_override": 3, "max_model_len": 256}),
        # rounded up to whole blocks
        ({"kv_cache_tokens": "257"}, {"num_gpu_blocks_override": 4, "max_model_len": 384}),
        # a shorter context stays
        (
            {"kv_cache_tokens": "256", "max_model_len": "200"},
            {"num_gpu_blocks_override": 3, "max_model_len": 200},
        ),
        ({}, {}),
    ],
)
def test_a_vllm_kv_budget_is_whole_cpu_blocks_and_a_context_that_fits(options, expected):
    parsed = vllm_common.parse_options("vllm", options, extra={})
    assert vllm_common.kv_budget_args(parsed) == expected
    args = vllm_common.engine_args(EngineConfig(Path("/model")), parsed)
    assert "kv_cache_tokens" not in args
    assert {k: args[k] for k in expected} == expected


def test_a_bad_kv_budget_is_one_line():
    with pytest.raises(UsageError, match="kv_cache_tokens"):
        vllm_common.parse_options("vllm", {"kv_cache_tokens": "0"}, extra={})


def test_sglangs_admission_estimate_does_not_outlive_the_variant_that_set_it(monkeypatch):
    name = sglang_common.CLIP_ESTIMATION
    monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sglang_common, "_USER_CLIP", None)
    budgeted = sglang_common.clip_estimation({"clip_max_new_tokens_estimation": 16})
    sglang_common.apply_environment(budgeted)
    assert os.environ[name] == "16"
    sglang_common.apply_environment(sglang_common.clip_estimation({}))
    assert name not in os.environ
    # the user's own value, as the harness found it, comes back
    monkeypatch.setattr(sglang_common, "_USER_CLIP", "64")
    sglang_common.apply_environment(sglang_common.clip_estimation({}))
    assert os.environ[name] == "64"


def test_the_budgeted_test_engine_preempts_and_repeats_its_tokens(default_model: Path):
    """BudgetedWaves (tests/support/engines.py) at 256 tokens, six 96 + 64-token requests:
    requests are preempted, and each request's tokens and log-probs are those it samples with
    room to spare (its stream is carried over the preemption)."""
    from support.engines import BudgetedWaves, ReseedsAfterPreemption

    prompts = [[(7 * i + 3 * j) % 380 + 3 for j in range(96)] for i in range(6)]
    spec = SamplingSpec(max_new_tokens=64, seed=5)
    ample = BudgetedWaves(EngineConfig(default_model))
    tight = BudgetedWaves(EngineConfig(default_model, options={"kv_budget_tokens": "256"}))
    alone, preempted = ample.generate(prompts, spec), tight.generate(prompts, spec)
    assert ample.preemptions() == 0 and tight.preemptions() > 0
    assert [c.tokens for c in preempted] == [c.tokens for c in alone]
    for a, b in zip(alone, preempted, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    reseeded = ReseedsAfterPreemption(tight.config).generate(prompts, spec)
    assert [c.tokens for c in reseeded] != [c.tokens for c in alone]
