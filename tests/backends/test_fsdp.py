"""The ``fsdp`` backend on real FSDP2 ranks (gloo on CPU): what it computes, how it shares and
stops its processes, and how a dead or hung rank surfaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support.server_processes import all_end, running

from conformance.backends import BACKENDS, BackendConfig
from conformance.backends import fsdp as fsdp_module
from conformance.backends._ranks import RankDied, RankFailed, RankTimeout
from conformance.backends.fsdp import shares
from conformance.errors import EngineCrashed, UsageError
from conformance.guard import Guarded

pytestmark = pytest.mark.fsdp

SEQUENCES = [list(range(5, 5 + n)) for n in (7, 12, 3, 20, 2)]


def fsdp(model: Path, **config) -> object:
    options = config.pop("options", {})
    return BACKENDS.get("fsdp")(BackendConfig(model=model, options=options, **config))


def own_ranks(model: Path, **config) -> object:
    """A backend whose ranks no other test shares (eager attention keys its group apart from the
    module's), for the tests that kill or stop a rank."""
    return fsdp(model, attn_implementation="eager", **config)


@pytest.fixture(scope="module")
def reference(default_model) -> list[torch.Tensor]:
    """The unsharded fp32 forward, one sequence per micro-batch."""
    hf = BACKENDS.get("hf")(BackendConfig(model=default_model, micro_batch_size=1))
    return hf.recompute(SEQUENCES).logprobs


@pytest.fixture(scope="module")
def pair(default_model):
    """The default backend (world size 2, fp32); while it is open, variants of it start no
    processes (they share its ranks), so most tests here use it or a variant."""
    backend = fsdp(default_model)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def single(default_model):
    """The backend at world size 1."""
    backend = fsdp(default_model, options={"world_size": "1"})
    yield backend
    backend.close()


@given(count=st.integers(0, 50), world_size=st.integers(1, 8))
def test_shares_split_a_batch_contiguously_and_evenly(count, world_size):
    ranges = shares(count, world_size)
    assert len(ranges) == world_size
    assert [i for r in ranges for i in r] == list(range(count))
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("size", ["single", "pair"])
def test_fp32_sharded_forward_matches_the_unsharded_model(request, reference, size):
    got = request.getfixturevalue(size).recompute(SEQUENCES)
    for lp, ent, ref, seq in zip(got.logprobs, got.entropy, reference, SEQUENCES, strict=True):
        assert lp.dtype == torch.float32 and lp.shape == ent.shape == (len(seq) - 1,)
        # a rank that scored another rank's sequences, or a shard left out, moves these by nats
        assert (lp - ref).abs().max() < 1e-5
        assert (ent > 0).all()


@pytest.mark.parametrize("layout", ["right-pad", "left-pad", "packed"])
@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_layouts_and_micro_batches_agree(default_model, pair, reference, layout, micro_batch_size):
    backend = fsdp(default_model, layout=layout, micro_batch_size=micro_batch_size)
    try:
        got = backend.recompute(SEQUENCES).logprobs
    finally:
        backend.close()
    for lp, ref in zip(got, reference, strict=True):
        assert (lp - ref).abs().max() < 1e-4


def test_bf16_compute_is_mixed_precision_and_measurably_off(default_model, reference):
    backend = fsdp(default_model, dtype="bfloat16")
    try:
        got = backend.recompute(SEQUENCES).logprobs
        info = backend.info()
    finally:
        backend.close()
    diffs = torch.cat([(lp - ref).abs() for lp, ref in zip(got, reference, strict=True)])
    # bf16 parameters and activations (8 mantissa bits) against fp32: far above fp32's 1e-6
    assert diffs.mean() > 1e-3
    assert diffs.max() < 1.0
    assert info["parallel"]["mixed_precision"] == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "float32",
    }


def test_processed_distribution_matches_the_unsharded_model(default_model, pair):
    hf = BACKENDS.get("hf")(BackendConfig(model=default_model))
    for sampling in ({"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.8, "temperature": 1.3}):
        expected = hf.recompute(SEQUENCES, **sampling).logprobs
        got = pair.recompute(SEQUENCES, **sampling).logprobs
        for e, g in zip(expected, got, strict=True):
            assert torch.equal(e.isinf(), g.isinf())
            assert (e - g).nan_to_num(posinf=0, neginf=0).abs().max() < 1e-5


def test_ranks_with_less_work_still_take_part(default_model, reference, pair):
    """One sequence for two ranks, and 3 micro-batches on rank 0 against 2 on rank 1: every
    forward is a collective, so a short-handed rank must run filler forwards, or this hangs."""
    (alone,) = pair.recompute(SEQUENCES[:1]).logprobs
    assert (alone - reference[0]).abs().max() < 1e-5
    uneven = fsdp(default_model, micro_batch_size=1)
    try:
        got = uneven.recompute(SEQUENCES).logprobs
    finally:
        uneven.close()
    assert [len(lp) for lp in got] == [len(s) - 1 for s in SEQUENCES]


def test_info_records_the_topology(pair):
    info = pair.info()
    assert info["parallel"]["world_size"] == 2
    assert info["parallel"]["process_group"] == "gloo"
    assert info["parallel"]["mixed_precision"] == {
        "param_dtype": "float32",
        "reduce_dtype": "float32",
    }
    assert len(info["pids"]) == 2 and running(info["pids"]) == info["pids"]


def test_variants_share_ranks_and_the_last_close_stops_them(default_model, pair, single):
    variant = fsdp(default_model, micro_batch_size=2, layout="left-pad")
    try:
        assert variant.info()["pids"] == pair.info()["pids"]
    finally:
        variant.close()
    assert set(single.info()["pids"]).isdisjoint(pair.info()["pids"])
    # the shared group outlives the variant that closed
    assert pair.recompute(SEQUENCES[:2]).logprobs
    alone = fsdp(default_model, options={"world_size": "3"})
    pids = alone.info()["pids"]
    assert len(pids) == 3
    alone.close()
    assert all_end(pids)


def test_grad_is_refused_with_the_way_to_train(pair):
    with pytest.raises(NotImplementedError, match="update"):
        pair.recompute(SEQUENCES, grad=True)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"world_size": "0"}, "world_size"), ({"world_size": "two"}, "world_size"), ({"x": "1"}, "x")],
)
def test_bad_options_are_one_line(default_model, options, named):
    with pytest.raises(UsageError) as caught:
        fsdp(default_model, options=options)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_a_rank_that_cannot_load_the_model_fails_the_start(tmp_path):
    with pytest.raises(RankFailed, match="cannot load a causal LM"):
        fsdp(tmp_path)


def test_a_rank_killed_between_calls_ends_the_next_call(default_model):
    backend = own_ranks(default_model)
    pids = backend.info()["pids"]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RankDied, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
        backend.recompute(SEQUENCES)
    backend.close()
    assert all_end(pids)


def test_a_rank_killed_mid_call_ends_the_call(default_model):
    backend = own_ranks(default_model, micro_batch_size=1)
    pids = backend.info()["pids"]
    long_batch = [list(range(2, 300))] * 64
    killer = threading.Timer(1.0, os.kill, (pids[0], signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with pytest.raises(RankDied, match="rank 0"):
        while time.monotonic() - started < 120:
            backend.recompute(long_batch)
    killer.join()
    backend.close()
    assert all_end(pids)


def test_a_hung_rank_ends_the_call_within_the_backends_timeout(default_model, monkeypatch):
    monkeypatch.setattr(fsdp_module, "TIMEOUT_S", 5.0)
    backend = own_ranks(default_model, options={"world_size": "1"})
    pids = backend.info()["pids"]
    os.kill(pids[0], signal.SIGSTOP)  # alive, never answering: a hang
    started = time.monotonic()
    with pytest.raises(RankTimeout, match="within 5 s"):
        backend.recompute(SEQUENCES)
    assert time.monotonic() - started < 30
    backend.close()
    assert all_end(pids)


def test_a_rank_hung_in_a_collective_ends_at_the_call_deadline(default_model):
    """What certify relies on: the guard's --call-timeout ends a hung call, and closing the
    backend then stops every rank, the one stuck in a collective included."""
    crashes: list[str] = []
    backend = Guarded(
        own_ranks(default_model),
        kind="backend",
        on_crash=crashes.append,
        timing={"backend_s": 0.0},
        deadline_s=5.0,
    )
    pids = backend.info()["pids"]
    os.kill(pids[1], signal.SIGSTOP)
    with pytest.raises(EngineCrashed, match="did not return within 5 s"):
        backend.recompute(SEQUENCES)
    backend.close()
    assert crashes and all_end(pids)


def test_ranks_exit_when_the_harness_is_killed(default_model, cli_env):
    script = (
        "import os, signal\n"
        "from conformance.backends import BACKENDS, BackendConfig\n"
        "from pathlib import Path\n"
        "if __name__ == '__main__':\n"
        f"    b = BACKENDS.get('fsdp')(BackendConfig(model=Path({str(default_model)!r})))\n"
        "    print(*b.info()['pids'], flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=cli_env, timeout=300
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    assert all_end(pids, within_s=15)
