"""The precision floor against objective-level hacking Table 2, and its CLI."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from support.doctests import run_doctests

from conformance import floor
from conformance.cli import main
from conformance.errors import UsageError
from conformance.floor import logit_std_for_entropy, mean_entropy, simulate_floor

#: Table 2 (bf16, vocab 2048, logit std 1.5, 50 000 tokens): per seed (max, min)
TABLE_2 = {1234: (1.0190, 0.9808), 1237: (1.0189, 0.9815)}


@pytest.mark.parametrize("seed", sorted(TABLE_2))
def test_reproduces_table_2(seed: int) -> None:
    got = simulate_floor("bf16", vocab=2048, logit_std=1.5, tokens=50_000, seed=seed)
    # mean 1.0000: 5 standard errors of a 50 000-token mean with std 0.0048 is 1.1e-4
    assert abs(got.ratio_mean - 1.0) < 1.1e-4
    assert abs(got.ratio_std - 0.0048) <= 0.0003
    # the extremes are tail statistics: the table's 1.0185–1.0193 is the bound for logits in
    # [4, 8); a sampled logit above 8 (a few per 10⁸) can push the max to ≈1.03 (see floor.py)
    table_max, table_min = TABLE_2[seed]
    assert table_max - 0.002 <= got.ratio_max <= 1.03
    assert 0.97 <= got.ratio_min <= table_min + 0.003


def test_token_kl_is_half_the_ratio_variance() -> None:
    """Second order: KL(p̃ ‖ p) = E_p̃[−log(p/p̃)] ≈ ½ Var(p/p̃) for p/p̃ close to 1."""
    got = simulate_floor("bf16", vocab=2048, logit_std=1.5, tokens=8000, seed=7)
    assert got.token_kl == pytest.approx(0.5 * got.ratio_std**2, rel=0.1)


def test_fp16_floor_is_about_eight_times_lower() -> None:
    """fp16 keeps 3 more mantissa bits than bf16: rounding steps 2³ = 8× finer."""
    kwargs = {"vocab": 2048, "logit_std": 1.5, "tokens": 8000, "seed": 3}
    ratio = simulate_floor("bf16", **kwargs).ratio_std / simulate_floor("fp16", **kwargs).ratio_std
    assert 5 < ratio < 12


def test_results_do_not_depend_on_chunk_size() -> None:
    kwargs = {"vocab": 300, "logit_std": 2.0, "tokens": 3001, "seed": 11}
    results = {rows: simulate_floor("bf16", **kwargs, chunk_rows=rows) for rows in (1, 700, 5000)}
    assert len(set(results.values())) == 1


def test_seeds_differ() -> None:
    kwargs = {"vocab": 300, "logit_std": 2.0, "tokens": 1000}
    assert simulate_floor("bf16", **kwargs, seed=1) != simulate_floor("bf16", **kwargs, seed=2)


def test_docstring_example_runs() -> None:
    run_doctests(floor)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "fp32"}, "zero by construction"),
        ({"dtype": "int8"}, "unknown dtype"),
        ({"vocab": 1}, "vocab=1"),
        ({"tokens": 0}, "tokens=0"),
        ({"logit_std": 0.0}, "logit_std=0.0"),
        ({"logit_std": math.nan}, "logit_std=nan"),
        ({"chunk_rows": 0}, "chunk_rows=0"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs: dict, message: str) -> None:
    args = {"dtype": "bf16", "vocab": 64, "logit_std": 1.0, "tokens": 10, "seed": 0} | kwargs
    chunk_rows = args.pop("chunk_rows", 4096)
    with pytest.raises(UsageError, match=message):
        simulate_floor(**args, chunk_rows=chunk_rows)


def test_cli_json_is_one_object_with_the_documented_keys(capsys) -> None:
    argv = ["floor", "--dtype", "bf16", "--vocab", "256", "--tokens", "500", "--seed", "5"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = dataclasses.asdict(simulate_floor("bf16", 256, 1.5, 500, 5))
    assert printed == expected
    assert {"ratio_mean", "ratio_std", "ratio_max", "ratio_min", "kl"} <= set(printed)


def test_cli_text_output_and_errors(capsys) -> None:
    assert main(["floor", "--dtype", "fp16", "--vocab", "128", "--tokens", "300"]) == 0
    out = capsys.readouterr().out
    assert "float16 vs float32" in out and "std" in out
    assert main(["floor", "--dtype", "fp32"]) == 2
    assert "use bf16 or fp16" in capsys.readouterr().err


@pytest.mark.parametrize(("vocab", "logit_std"), [(384, 0.7), (384, 3.0), (2048, 1.5)])
def test_logit_std_for_entropy_inverts_mean_entropy(vocab: int, logit_std: float) -> None:
    entropy = mean_entropy(vocab, logit_std, seed=4)
    assert 0 < entropy < math.log(vocab)
    assert logit_std_for_entropy(vocab, entropy, seed=4) == pytest.approx(logit_std, rel=1e-6)


def test_mean_entropy_falls_as_logits_spread() -> None:
    entropies = [mean_entropy(384, s) for s in (0.001, 0.5, 1.0, 2.0, 4.0)]
    assert entropies == sorted(entropies, reverse=True)
    assert entropies[0] == pytest.approx(math.log(384), rel=1e-6)


@pytest.mark.parametrize(
    ("vocab", "entropy", "message"), [(1, 1.0, "vocab=1"), (64, 0.0, "entropy")]
)
def test_logit_std_for_entropy_rejects_bad_arguments(vocab: int, entropy: float, message: str):
    with pytest.raises(UsageError, match=message):
        logit_std_for_entropy(vocab, entropy)
