"""The fsdp backend trains as the Backend training protocol says: the same loss, gradient norm and
counts as the in-process hf backend on the same batch, whatever the world size and however
unevenly the batch splits; full weights under transformers' names; trained ranks never shared.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.server_processes import all_end, group_ends

from conformance.backends import BACKENDS, BackendConfig
from conformance.training import COUNTS, Objective, PolicyBatch

pytestmark = pytest.mark.fsdp

REPO = Path(__file__).resolve().parents[2]


def batch(size: int, *, objective: str = "token-clip", seed: int = 0) -> PolicyBatch:
    rng = random.Random(seed)
    sequences = tuple(
        tuple(rng.randrange(3, 384) for _ in range(rng.randrange(6, 24))) for _ in range(size)
    )
    prompts = tuple(rng.randrange(2, 5) for _ in sequences)
    if objective == "nll":
        return PolicyBatch(sequences, prompts, Objective("nll"), lr=1e-3, max_grad_norm=None)
    generator = torch.Generator().manual_seed(seed)
    width = max(len(s) - p for s, p in zip(sequences, prompts, strict=True))
    return PolicyBatch(
        sequences,
        prompts,
        Objective(objective),
        lr=1e-3,
        # old log-probs near the model's (ratios near 1, some clipped), advantages of both signs
        old_logprobs=-5.9 + 0.3 * torch.randn(size, width, generator=generator),
        advantages=torch.randn(size, generator=generator),
        weights=torch.rand(size, width, generator=generator) + 0.5,
    )


def figures(backend, batches: list[PolicyBatch | None]) -> list[dict[str, float]]:
    """``update`` each batch in turn (``None``: ``reset_optimizer``)."""
    out = []
    for b in batches:
        if b is None:
            backend.reset_optimizer()
        else:
            out.append(backend.update(b))
    return out


def assert_same_figures(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == {"loss", "grad_norm", *COUNTS}
        for key in ("tokens", "sequences", "clip_low", "clip_high", "clip_seq"):
            assert g[key] == w[key], key
        for key in ("loss", "grad_norm", "ratio_k3"):
            # summed, not averaged, over ranks: an averaged gradient would halve the norm
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), key


#: warm start, reset, two RL updates, and a batch with fewer sequences than ranks
SCHEDULE = [
    batch(9, objective="nll"),
    None,
    batch(9),
    batch(9, objective="seq-clip", seed=1),
    batch(1, seed=2),
]


@pytest.fixture(scope="module")
def hf_run(default_model) -> tuple[list[dict], dict[str, torch.Tensor]]:
    hf = BACKENDS.get("hf")(BackendConfig(model=default_model, micro_batch_size=4))
    return figures(hf, SCHEDULE), hf.state_dict()


@pytest.mark.parametrize(("world_size", "micro_batch_size"), [(1, 4), (2, 1), (3, 2)])
def test_updates_match_the_in_process_backend(default_model, hf_run, world_size, micro_batch_size):
    backend = BACKENDS.get("fsdp")(
        BackendConfig(
            model=default_model,
            micro_batch_size=micro_batch_size,
            options={"world_size": str(world_size)},
        )
    )
    try:
        got = figures(backend, SCHEDULE)
        weights = backend.state_dict()
    finally:
        backend.close()
    want, hf_weights = hf_run
    assert_same_figures(got, want)
    initial = BACKENDS.get("hf")(BackendConfig(model=default_model)).state_dict()
    assert weights.keys() == hf_weights.keys() == initial.keys()
    for name, tensor in weights.items():
        moved = (hf_weights[name] - initial[name]).abs().max()
        # Adam amplifies last-bit gradient differences; the steps themselves are ~lr per step
        assert (tensor - hf_weights[name]).abs().max() <= 0.1 * moved + 1e-7, name


def test_full_weights_and_a_trainer_with_ranks_of_its_own(default_model):
    config = BackendConfig(model=default_model)
    scorer = BACKENDS.get("fsdp")(config)
    trainer = BACKENDS.get("fsdp")(BackendConfig(model=default_model, micro_batch_size=2))
    try:
        shared = scorer.info()["pids"]
        assert trainer.info()["pids"] == shared
        initial = BACKENDS.get("hf")(config).state_dict()
        untrained = trainer.state_dict()
        assert untrained.keys() == initial.keys()
        assert all(torch.equal(untrained[k], initial[k]) for k in initial)
        before = scorer.recompute([[5, 6, 7, 8]]).logprobs[0]
        trainer.update(batch(4, objective="nll"))
        assert set(trainer.info()["pids"]).isdisjoint(shared)
        # the scorer, and a backend built now, still see the model folder's weights
        assert torch.equal(scorer.recompute([[5, 6, 7, 8]]).logprobs[0], before)
        later = BACKENDS.get("fsdp")(config)
        assert later.info()["pids"] == shared
        later.close()
        trained = trainer.info()["pids"]
    finally:
        trainer.close()
        scorer.close()
    assert all_end(shared + trained)


def test_rl_smoke_trains_through_fsdp_and_leaves_no_rank(tmp_path, cli_env):
    out = tmp_path / "rl"
    process = subprocess.Popen(
        [
            sys.executable, "-m", "conformance", "rl-smoke", "--backend", "fsdp",
            "--steps", "4", "--warm-steps", "5", "--out", str(out),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env, cwd=REPO,
        start_new_session=True,
    )  # fmt: skip
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-3000:]
    rows = [json.loads(line) for line in (out / "rl.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["grad_norm"] > 0 and r["updates"] == 1 for r in rows)
    assert json.loads((out / "rl-summary.json").read_text())["steps"] == 4
    # the ranks were started in the run's process group
    assert group_ends(process.pid)
