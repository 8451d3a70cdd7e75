"""What only SGLang does, against a real SGLang on its CPU engine (tox -e sglang); the protocol
and the precision controls every engine passes are in test_contract.py.

An engine start takes one to two minutes on two busy cores: the module starts one.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.certify_runs import certify
from support.engine_tests import needs, over_budget, started

from conformance.engines import SamplingSpec
from conformance.engines import _sglang_common as common
from conformance.errors import EngineCrashed
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.models import make_model

pytestmark = needs("sglang")


@pytest.fixture(scope="module")
def engine(default_model: Path) -> Iterator[object]:
    with started("sglang", default_model) as engine:
        yield engine


def abs_diff_max(hf, sequence: list[int], scored: list[float]) -> float:
    reference, mask = stack_ragged([hf.recompute([sequence]).logprobs[0].tolist()])
    measured, _ = stack_ragged([scored])
    return mismatch_metrics(reference, measured, mask)["abs_diff_max"]


def test_score_drops_the_leading_none_and_keeps_every_position(engine, hf) -> None:
    """SGLang's first input logprob is None; from logprob_start_len=0 the rest line up."""
    sequence = [7, 19, 200, 31, 5]
    reply = engine._run(common.score_request([sequence]))[0]
    assert reply["meta_info"]["input_token_logprobs"][0][0] is None
    scored = engine.score([sequence])[0]
    assert len(scored) == len(sequence) - 1
    assert abs_diff_max(hf, sequence, scored) < 1e-5


def test_ids_at_the_top_of_the_vocabulary_are_scored_right(engine, hf) -> None:
    """SGLang reports ids >= vocab_size − 1 as 0 beside their (right) input logprobs."""
    sequence = [5, 383, 382, 383, 7, 383]
    reply = engine._run(common.score_request([sequence]))[0]
    reported_ids = [entry[1] for entry in reply["meta_info"]["input_token_logprobs"]]
    # the quirk this test guards against is present in this SGLang
    assert reported_ids != sequence
    assert abs_diff_max(hf, sequence, engine.score([sequence])[0]) < 1e-5


def test_the_cpu_engine_does_not_honour_seeds_and_says_so(engine) -> None:
    """SGLang applies a request's sampling_seed only in deterministic-inference mode, which
    its CPU attention backend (torch_native) refuses; info() must not claim seeded rollouts."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 384) for _ in range(12)] for _ in range(4)]
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, seed=11)
    first = engine.generate(prompts, spec)
    second = engine.generate(prompts, spec)
    assert engine.info()["seeded"] is False
    assert [c.tokens for c in first] != [c.tokens for c in second]


def test_info_names_what_sglang_reads_from_the_environment(engine) -> None:
    info = engine.info()
    assert info["sglang"] and info["knobs"]["max_total_tokens"] == 2048
    # raw output logprobs, and the rope cache in fp32 as on GPU
    assert info["env"]["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"
    assert info["env"]["SGLANG_ROPE_CACHE_FP32"] == "1"


def test_a_kv_budget_makes_sglang_retract(engine, default_model: Path) -> None:
    """max_total_tokens=256 (kv_budget_option) with its admission estimate of 16 tokens to come
    (kv_budget_requires): a batch needing 960 tokens is retracted, as the replies'
    num_retractions count; with room to spare (the module's 2,048 tokens) nothing is."""
    assert over_budget(engine) == 0
    declared = engine.capabilities
    options = {**declared.kv_budget_requires, declared.kv_budget_option: "256"}
    with started("sglang", default_model, options=options) as budgeted:
        assert over_budget(budgeted) > 0


def test_a_sigquit_from_a_failing_child_is_a_crash_of_the_call_not_of_this_process(
    engine,
) -> None:
    """SGLang's children SIGQUIT this process when one fails; SGLang's handler then killed the
    whole process tree, the harness with it, before any report was written. The engine's
    handler raises a crash in whatever call is running instead: this process lives, and an
    engine whose children are in fact fine goes on serving."""
    with pytest.raises(EngineCrashed, match="SIGQUIT"):
        os.kill(os.getpid(), signal.SIGQUIT)
        engine.generate([[5, 6, 7, 8]], SamplingSpec(max_new_tokens=4, seed=3))
    assert len(engine.generate([[5, 6, 7, 8]], SamplingSpec(max_new_tokens=4))[0].tokens) == 4


@pytest.mark.parametrize(
    ("arch", "says"),
    [("bamba", "SGLang's engine failed to start"), ("qwen2-moe", "signalled this one (SIGQUIT)")],
)
def test_a_model_sglang_cannot_run_ends_the_run_incomplete_with_its_report(
    arch: str, says: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """SGLang 0.5.23's CPU engine has no Bamba (its scheduler dies loading the model) and no
    CPU path for Qwen2-MoE's shared-expert gate (a Triton kernel: the scheduler dies in the
    first prefill); either way the scheduler SIGQUITs this process, and a certify ended with
    exit -9 and no report.json. The run is incomplete with the reason, its report written, no
    process of the engine left."""
    import psutil

    model = make_model(tmp_path / arch, arch=arch).path
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code, report, output = certify(
        "--model", str(model), "--engine", "sglang", "--profile", "fp32",
        "--suite", "prefill_parity", "--examples", "1", env=cli_env, out=tmp_path / "run",
    )  # fmt: skip
    assert code == 2, output[-3000:]
    assert report["verdict"] == "incomplete"
    assert says in report["reason"], report["reason"]
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
