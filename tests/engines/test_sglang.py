"""The in-process ``sglang`` engine against a real SGLang (tox -e sglang) and the transformers
forward: SGLang's scheduler, cache, sampler and logprob processing all run, on its CPU engine.

Each engine start takes one to two minutes on two busy cores, so the fp32 engine is started
once per module; the bf16 and processed-logprob engines once each.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.backends.base import BackendConfig
from conformance.engines import EngineConfig, LogprobKind, SamplingSpec
from conformance.errors import EngineCrashed, UsageError
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.profiles import load_profile

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="sglang is not installed (run tox -e sglang, or pip install 'sglang==0.5.23')",
)


def random_sequences(count: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(4, 48))] for _ in range(count)]


def metrics(reference: list[list[float]], measured: list[list[float]]) -> dict[str, float]:
    ref, mask = stack_ragged(reference)
    got, got_mask = stack_ragged(measured)
    assert got_mask.equal(mask), "engine and reference score different numbers of positions"
    return mismatch_metrics(ref, got, mask)


def violated(profile: str, measured: dict[str, float]) -> set[str]:
    return {v.metric for v in load_profile(profile).check(measured)}


def sglang_engine(model: Path, **changes: object):
    from conformance.engines.sglang import SGLangEngine

    return SGLangEngine(EngineConfig(model=model, **changes))


@pytest.fixture(scope="module")
def hf(default_model: Path):
    from conformance.backends.hf import HFBackend

    backend = HFBackend(BackendConfig(model=default_model))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def engine(default_model: Path) -> Iterator[object]:
    engine = sglang_engine(default_model)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    return random_sequences(12, 384, seed=0)


def test_unknown_option_is_a_usage_error_listing_the_valid_ones(default_model: Path) -> None:
    with pytest.raises(UsageError, match="max_total_tokens") as error:
        sglang_engine(default_model, options={"radix": "off"})
    assert "\n" not in str(error.value)


def test_bad_option_value_is_a_usage_error(default_model: Path) -> None:
    with pytest.raises(UsageError, match="disable_radix_cache"):
        sglang_engine(default_model, options={"disable_radix_cache": "maybe"})


@pytest.mark.sglang
@needs_sglang
def test_fp32_scores_pass_the_fp32_profile(engine, hf, sequences) -> None:
    measured = metrics(hf.recompute(sequences).logprobs, engine.score(sequences))
    assert not violated("fp32", measured), measured


@pytest.mark.sglang
@needs_sglang
def test_bf16_engine_fails_fp32_and_passes_bf16(default_model, hf, sequences) -> None:
    engine = sglang_engine(default_model, dtype="bfloat16")
    try:
        measured = metrics(hf.recompute(sequences).logprobs, engine.score(sequences))
        assert engine.info()["env"]["SGLANG_ROPE_CACHE_FP32"] == "1"
    finally:
        engine.close()
    assert "abs_diff_max" in violated("fp32", measured), measured
    assert not violated("bf16", measured), measured


@pytest.mark.sglang
@needs_sglang
def test_score_drops_the_leading_none_and_keeps_every_position(engine, hf) -> None:
    """SGLang's first input logprob is None; from logprob_start_len=0 the rest line up."""
    from conformance.engines import _sglang_common as common

    sequence = [7, 19, 200, 31, 5]
    reply = engine._run(common.score_request([sequence]))[0]
    assert reply["meta_info"]["input_token_logprobs"][0][0] is None
    scored = engine.score([sequence])[0]
    assert len(scored) == len(sequence) - 1
    assert metrics(hf.recompute([sequence]).logprobs, [scored])["abs_diff_max"] < 1e-5


@pytest.mark.sglang
@needs_sglang
def test_ids_at_the_top_of_the_vocabulary_are_scored_right(engine, hf) -> None:
    """SGLang reports ids >= vocab_size − 1 as 0 beside their (right) input logprobs."""
    from conformance.engines import _sglang_common as common

    sequence = [5, 383, 382, 383, 7, 383]
    reply = engine._run(common.score_request([sequence]))[0]
    reported_ids = [entry[1] for entry in reply["meta_info"]["input_token_logprobs"]]
    # the quirk this test guards against is present in this SGLang
    assert reported_ids != sequence
    assert (
        metrics(hf.recompute([sequence]).logprobs, engine.score([sequence]))["abs_diff_max"] < 1e-5
    )


@pytest.mark.sglang
@needs_sglang
def test_sampled_logprobs_are_raw_at_any_temperature(engine, hf, sequences) -> None:
    spec = SamplingSpec(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=5)
    rollouts = engine.generate(sequences[:6], spec)
    assert all(len(c.tokens) == 6 for c in rollouts)
    raw = hf.recompute([c.sequence for c in rollouts]).logprobs
    reference = [row[-len(c.tokens) :] for row, c in zip(raw, rollouts, strict=True)]
    assert not violated("fp32", metrics(reference, [c.logprobs for c in rollouts]))


@pytest.mark.sglang
@needs_sglang
def test_processed_logprobs_carry_the_temperature_signature(default_model, hf, sequences) -> None:
    """processed = log_softmax(logits / T) at the sampled token, not log_softmax(logits)."""
    engine = sglang_engine(default_model, logprobs=LogprobKind.PROCESSED)
    try:
        assert engine.info()["env"]["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "0"
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


@pytest.mark.sglang
@needs_sglang
def test_sampled_logprobs_equal_the_engines_own_scoring(engine, sequences) -> None:
    rollouts = engine.generate(sequences[:6], SamplingSpec(max_new_tokens=8, seed=3))
    scored = engine.score([c.sequence for c in rollouts])
    prefilled = [row[-len(c.tokens) :] for row, c in zip(scored, rollouts, strict=True)]
    assert metrics(prefilled, [c.logprobs for c in rollouts])["abs_diff_max"] < 1e-4


@pytest.mark.sglang
@needs_sglang
def test_the_cpu_engine_does_not_honour_seeds_and_says_so(engine, sequences) -> None:
    """SGLang applies a request's sampling_seed only in deterministic-inference mode, which
    its CPU attention backend (torch_native) refuses; info() must not claim seeded rollouts."""
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, seed=11)
    first = engine.generate(sequences[:4], spec)
    second = engine.generate(sequences[:4], spec)
    assert engine.info()["seeded"] is False
    assert [c.tokens for c in first] != [c.tokens for c in second]


@pytest.mark.sglang
@needs_sglang
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
            assert list(top.values()) == sorted(top.values(), reverse=True)
            assert logprob <= max(top.values())
            if token in top:
                assert top[token] == logprob


@pytest.mark.sglang
@needs_sglang
def test_load_weights_makes_the_engine_score_like_the_new_model(
    default_model: Path, tmp_path: Path, engine, sequences
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
    try:
        before = engine.score(sequences)
        engine.load_weights(load_file(other / "model.safetensors"))
        after = engine.score(sequences)
        expected = backend.recompute(sequences).logprobs
        # put the module's engine back on the default model for the tests after this one
        engine.load_weights(load_file(default_model / "model.safetensors"))
    finally:
        backend.close()
    assert not violated("fp32", metrics(expected, after))
    assert metrics(expected, before)["abs_diff_max"] > 1e-2


@pytest.mark.sglang
@needs_sglang
def test_info_names_the_version_and_knobs_and_close_is_idempotent(engine, sequences) -> None:
    info = engine.info()
    assert info["sglang"]
    assert info["knobs"]["max_total_tokens"] == 2048
    assert info["env"]["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"
    assert set(engine.knobs()) >= {"disable_radix_cache", "chunked_prefill_size"}
    # the module's last test: the fixture closes it a third time
    engine.close()
    engine.close()
    with pytest.raises(EngineCrashed, match="closed"):
        engine.score(sequences[:1])
