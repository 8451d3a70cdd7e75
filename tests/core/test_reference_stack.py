"""The transformers reference stack: hf-generate (KV-cache decode) vs hf (full forward)."""

from __future__ import annotations

import pytest
import torch

from conformance.backends import BACKENDS, BackendConfig
from conformance.engines import ENGINES, EngineConfig, LogprobKind, SamplingSpec
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.suite_support import generated_rows

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15], [20], [3, 3, 3, 3]]
ROLLOUT = SamplingSpec(max_new_tokens=24, seed=7)


def _rollout_metrics(engine_dtype: str, model):
    engine = ENGINES.get("hf-generate")(EngineConfig(model=model, dtype=engine_dtype))
    backend = BACKENDS.get("hf")(BackendConfig(model=model))
    completions = engine.generate(PROMPTS, ROLLOUT)
    recomputed = backend.recompute([c.sequence for c in completions]).logprobs
    lp_train, lp_infer, _ = generated_rows(completions, recomputed)
    train, mask = stack_ragged(lp_train)
    infer, _ = stack_ragged(lp_infer)
    return mismatch_metrics(train, infer, mask)


def test_fp32_decode_agrees_with_full_forward(default_model):
    metrics = _rollout_metrics("float32", default_model)
    assert metrics["abs_diff_max"] < 1e-5
    assert metrics["pcc"] > 0.999999


def test_bf16_decode_measurably_disagrees(default_model):
    fp32 = _rollout_metrics("float32", default_model)
    bf16 = _rollout_metrics("bfloat16", default_model)
    # bf16 rounds every activation to 8 mantissa bits (relative error 2^-9): far above fp32's
    assert bf16["abs_diff_mean"] > 1e-3
    assert bf16["abs_diff_mean"] > 100 * fp32["abs_diff_mean"]


def test_generation_is_reproducible_per_seed(default_model):
    engine = ENGINES.get("hf-generate")(EngineConfig(model=default_model))
    first = engine.generate(PROMPTS, SamplingSpec(max_new_tokens=12, seed=3))
    again = engine.generate(PROMPTS, SamplingSpec(max_new_tokens=12, seed=3))
    other = engine.generate(PROMPTS, SamplingSpec(max_new_tokens=12, seed=4))
    assert [c.tokens for c in first] == [c.tokens for c in again]
    assert [c.tokens for c in first] != [c.tokens for c in other]


def test_processed_logprobs_are_temperature_scaled(default_model):
    temperature = 0.7
    engine = ENGINES.get("hf-generate")(
        EngineConfig(model=default_model, logprobs=LogprobKind.PROCESSED)
    )
    backend = BACKENDS.get("hf")(BackendConfig(model=default_model))
    completions = engine.generate(PROMPTS, SamplingSpec(max_new_tokens=8, temperature=0.7))
    sequences = [c.sequence for c in completions]
    scaled = backend.recompute(sequences, temperature=temperature).logprobs
    raw = backend.recompute(sequences).logprobs
    lp_scaled, lp_engine, _ = generated_rows(completions, scaled)
    lp_raw, _, _ = generated_rows(completions, raw)
    flat = torch.tensor([v for row in lp_engine for v in row])
    assert torch.allclose(flat, torch.tensor([v for row in lp_scaled for v in row]), atol=1e-4)
    assert not torch.allclose(flat, torch.tensor([v for row in lp_raw for v in row]), atol=1e-2)


def test_eos_ends_a_rollout_when_not_ignored(default_model):
    engine = ENGINES.get("hf-generate")(EngineConfig(model=default_model))
    eos, prompts, budget = engine._eos_id, [[engine._eos_id - 1]] * 16, 64
    stopped = engine.generate(
        prompts, SamplingSpec(max_new_tokens=budget, seed=1, ignore_eos=False)
    )
    ignored = engine.generate(prompts, SamplingSpec(max_new_tokens=budget, seed=1, ignore_eos=True))
    # both endings must occur, or the per-rollout checks below would hold vacuously
    endings = {c.finish_reason for c in stopped}
    assert endings == {"stop", "length"}, endings
    for s, i in zip(stopped, ignored, strict=True):
        # the same seed samples the same tokens: a rollout stops at the first EOS it samples,
        # and ignoring EOS runs on through it to the full budget
        assert i.finish_reason == "length" and len(i.tokens) == budget
        end = i.tokens.index(eos) + 1 if eos in i.tokens else budget
        assert s.tokens == i.tokens[:end]
        assert s.finish_reason == ("stop" if eos in i.tokens else "length")
        assert len(s.logprobs) == len(s.tokens)


@pytest.mark.parametrize("layout", ["right-pad", "left-pad", "packed"])
@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_backend_layouts_agree(default_model, layout, micro_batch_size):
    sequences = [list(range(5, 5 + n)) for n in (7, 12, 3, 20, 2)]
    reference = BACKENDS.get("hf")(BackendConfig(model=default_model, micro_batch_size=1))
    variant = BACKENDS.get("hf")(
        BackendConfig(model=default_model, layout=layout, micro_batch_size=micro_batch_size)
    )
    expected = reference.recompute(sequences).logprobs
    got = variant.recompute(sequences).logprobs
    for e, g, seq in zip(expected, got, sequences, strict=True):
        assert g.shape == (len(seq) - 1,)
        # a packing mask that leaked across sequences would move these by O(1) nats
        assert (e - g).abs().max() < 1e-4


def test_backend_keeps_the_graph_for_training(default_model):
    backend = BACKENDS.get("hf")(BackendConfig(model=default_model))
    logprobs = backend.recompute([[5, 6, 7, 8]], grad=True).logprobs[0]
    logprobs.sum().backward()
    grads = [p.grad for p in backend.module.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
