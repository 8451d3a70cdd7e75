"""Engine knobs in few engine starts: the covering of knob values by variant engines, the
bisection of a failing variant, and both end to end on an engine whose defect hides behind one
knob value."""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.engines import Knob, _sglang_common, _vllm_common
from conformance.errors import UsageError
from conformance.knobs import MAX_VARIANTS, cover, smallest_failing, with_requirements

REPO = Path(__file__).resolve().parents[2]
VLLM_KNOBS = _vllm_common.CAPABILITIES.knobs
SGLANG_KNOBS = _sglang_common.CAPABILITIES.knobs

values = st.lists(st.sampled_from("abcd"), min_size=1, max_size=MAX_VARIANTS, unique=True)
knob_tables = st.dictionaries(st.sampled_from(["k1", "k2", "k3", "k4", "k5"]), values, min_size=1)


@given(knob_tables)
def test_every_value_runs_in_as_many_variants_as_the_longest_knob_has_values(table) -> None:
    knobs = {name: Knob(tuple(vals)) for name, vals in table.items()}
    variants = cover(knobs)
    assert len(variants) == max(len(vals) for vals in table.values())
    held = {(name, value) for variant in variants for name, value in variant.items()}
    assert held == {(name, value) for name, vals in table.items() for value in vals}


@given(knob_tables, st.data())
def test_a_variant_holds_what_its_values_require(table, data) -> None:
    names = sorted(table)
    knobs = {}
    for name in names:
        # requirements on other knobs' values, as vLLM's prefill budget needs chunked prefill
        others = [other for other in names if other != name]
        needs = data.draw(st.dictionaries(st.sampled_from(others), st.just("a"))) if others else {}
        knobs[name] = Knob(tuple(table[name]), requires=needs)
    try:
        variants = cover(knobs, budget=8)
    except UsageError:
        return
    for variant in variants:
        for name, value in variant.items():
            if name in knobs and value in knobs[name].values:
                for key, needed in knobs[name].requires.items():
                    assert variant.get(key) == needed
    held = {(name, value) for variant in variants for name, value in variant.items()}
    assert held >= {(name, value) for name, knob in knobs.items() for value in knob.values}


def test_more_values_than_the_budget_is_one_line_naming_the_knob() -> None:
    with pytest.raises(UsageError, match="max_num_seqs") as error:
        cover({"max_num_seqs": Knob(("1", "2", "4", "8"))})
    assert "\n" not in str(error.value)


def test_vllms_nine_knob_values_need_three_engines_and_no_invalid_combination() -> None:
    variants = cover(VLLM_KNOBS)
    assert len(variants) == 3
    for variant in variants:
        # vLLM refuses a prefill budget below the context length without chunked prefill
        if "max_num_batched_tokens" in variant:
            assert variant["enable_chunked_prefill"] == "true"
    assert variants[0]["enforce_eager"] == "false"
    assert sum("enforce_eager" in variant for variant in variants) == 1


def test_sglangs_knob_values_need_two_engines() -> None:
    assert len(cover(SGLANG_KNOBS)) == 2


def test_a_part_of_a_variant_started_alone_gets_its_requirements() -> None:
    assert with_requirements({"max_num_batched_tokens": "16"}, VLLM_KNOBS) == {
        "max_num_batched_tokens": "16",
        "enable_chunked_prefill": "true",
    }
    assert with_requirements({"max_num_seqs": "1"}, VLLM_KNOBS) == {"max_num_seqs": "1"}


@given(
    st.integers(min_value=1, max_value=8).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))
    )
)
def test_bisection_finds_exactly_the_knobs_that_fail_together(case) -> None:
    size, culprits = case
    changes = {f"knob{i}": str(i) for i in range(size)}
    calls = []

    def fails(part: dict[str, str]) -> bool:
        calls.append(part)
        return {f"knob{i}" for i in culprits} <= set(part)

    assert set(smallest_failing(changes, fails)) == {f"knob{i}" for i in culprits}
    assert {} not in calls, "the configured engine itself was replayed"
    assert len(calls) == len({tuple(sorted(c.items())) for c in calls}), "a part was retried"
    if len(culprits) == 1 and size > 1:
        # one culprit costs engine starts logarithmic in the variant's knobs
        assert len(calls) <= 2 * math.ceil(math.log2(size))


def certify_knobs(engine: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``certify`` of the knob suite alone, 2 examples, on an engine of ``knob_engines``."""
    return subprocess.run(
        [
            sys.executable, "-m", "conformance", "certify", "--examples", "2", "--out", str(out),
            "--engine", f"tests.support.knob_engines:{engine}", "--suite", "engine_knobs",
        ],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
    )  # fmt: skip


def test_a_defect_behind_one_knob_value_fails_certify_naming_that_knob(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The documentation's micro-batched engine plus a knob that skews every log-prob: certify
    holds both knobs in one variant, which fails; bisection names the skewing knob alone."""
    out = tmp_path / "run"
    result = certify_knobs("SkewedKnobEngine", out, cli_env)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    knob_checks = {c["name"]: c for c in report["checks"] if c["suite"] == "engine_knobs"}
    failed = knob_checks["test_knobs_keep_logprobs[variant0]"]
    assert failed["status"] == "fail"
    assert failed["context"]["knobs"] == {"max_batch": "1", "skew_logprobs": "true"}
    assert failed["message"].startswith("engine_knobs: skew_logprobs=true changes logprobs: ")
    assert failed["worst_case"]["knobs"] == {"skew_logprobs": "true"}
    assert failed["worst_case"]["prompt_ids"]
    passed = knob_checks["test_knobs_keep_logprobs[variant1]"]
    assert (passed["status"], passed["context"]["knobs"]) == ("pass", {"max_batch": "8"})
    events = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["event"] == "engine_started"]
    # the stack's engine, the failing variant, its two halves, the passing variant
    assert [s["changes"] for s in starts] == [
        {},
        {"max_batch": "1", "skew_logprobs": "true"},
        {"max_batch": "1"},
        {"skew_logprobs": "true"},
        {"max_batch": "8"},
    ]
    # every start is booked as engine time, none as the harness's
    timing = report["timing"]
    assert timing["engine_start_s"] == pytest.approx(sum(s["seconds"] for s in starts), abs=0.01)


def test_a_variant_that_cannot_sample_a_rollout_says_how_many_it_scored_only(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Under ``prefill_chunk=8`` no seeded rollout starts from a longer prompt (vLLM-CPU's
    limit): those examples are scored only, and the passing check says how many and why. The
    example at the top sizes has 512-token prompts, so at least one is."""
    out = tmp_path / "run"
    result = certify_knobs("ChunkSeededEngine", out, cli_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["status"] == "pass"]
    unsampled, _, rollouts = (
        check["message"].partition(" rollouts not sampled")[0].partition(" of ")
    )
    assert 1 <= int(unsampled) <= int(rollouts) == 3, check["message"]  # 2 drawn, 1 at the top
    assert "prefilled in chunks of 8 tokens" in check["message"], check["message"]


def test_the_docstring_examples_hold() -> None:
    import conformance.knobs

    assert doctest.testmod(conformance.knobs).failed == 0
