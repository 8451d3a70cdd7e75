"""Reports built from real log-probabilities, ``conformance.metrics`` and a real profile.

A "stack" here is a precision for the inference side's logits: the trainer's log-probs are
log-softmax of fp32 logits z ~ N(0, 1.5²) (objective-level-hacking App. C.1's setting); the
engine's are the same after rounding z through ``engine_dtype`` — what a bf16 kernel does to
the numbers a trainer compares against.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from conformance.metrics import mismatch_metrics
from conformance.profiles import Profile
from conformance.report.schema import Check, ProfileInfo, Report, Stack, Violation

VOCAB = 384
#: an fp32-like profile for these tests: tight upper bounds, a lower bound on pcc
FP32_THRESHOLDS = {"abs_diff_max": 1e-4, "rho_std": 1e-4, "pcc": 0.9999}
#: a bf16-like profile, loose enough for the bf16 stack to pass
BF16_THRESHOLDS = {"abs_diff_max": 0.5, "rho_std": 0.1, "pcc": 0.99}
SUITES = ("prefill_parity", "rollout_parity")
MODEL_SHA = hashlib.sha256(b"tiny-model").hexdigest()


@dataclass(frozen=True)
class Measured:
    lp_train: torch.Tensor
    lp_infer: torch.Tensor
    mask: torch.Tensor


def measure(engine_dtype: torch.dtype, *, seed: int, batch: int = 4, seq: int = 32) -> Measured:
    """Sampled tokens' log-probs on both sides; masks a ragged tail off each row."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, VOCAB, generator=gen) * 1.5
    tokens = torch.multinomial(logits.softmax(-1).view(-1, VOCAB), 1, generator=gen).view(
        batch, seq
    )
    lp_train = logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    rounded = logits.to(engine_dtype).float()
    lp_infer = rounded.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    lengths = torch.arange(seq, seq - batch, -1)
    mask = torch.arange(seq)[None, :] < lengths[:, None]
    return Measured(lp_train, lp_infer, mask)


def make_check(suite: str, index: int, m: Measured, thresholds: dict[str, float]) -> Check:
    """One check, judged against ``thresholds`` by the profile code the session uses."""
    metrics = mismatch_metrics(m.lp_train, m.lp_infer, m.mask)
    violations = Profile("test", Path("test.toml"), dict(thresholds)).check(metrics)
    positions = torch.arange(m.mask.shape[1]).expand_as(m.mask)
    name = f"test_{suite}[{index}]"
    nodeid = f"suites/test_{suite}.py::{name}"
    worst_case = {
        "prompt_ids": [[1, 2, 3], [4, 5]],
        "batch_shape": {"batch_size": 2, "lengths": [3, 2], "padding_side": "left"},
        "sampling": {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0},
        "replay": f"pytest '{nodeid}' --tim-engine hf-generate --hypothesis-seed 123",
    }
    return Check(
        suite=suite,
        name=name,
        nodeid=nodeid,
        status="fail" if violations else "pass",
        message="; ".join(f"{v.metric} = {v.value:.3g} vs {v.threshold:g}" for v in violations),
        metrics=metrics,
        thresholds=dict(thresholds),
        violations=[Violation.of(v) for v in violations],
        worst_case=worst_case if violations else None,
        samples={
            "lp_train": m.lp_train[m.mask].tolist(),
            "lp_infer": m.lp_infer[m.mask].tolist(),
            "position": positions[m.mask].tolist(),
        },
        examples_run=10,
    )


def make_report(
    engine_dtype: torch.dtype = torch.float32,
    *,
    thresholds: dict[str, float] = FP32_THRESHOLDS,
    checks_per_suite: int = 2,
    seed: int = 123,
) -> Report:
    """A whole report: every suite measures the same stack on different random inputs."""
    checks = [
        make_check(suite, i, measure(engine_dtype, seed=seed * 1000 + 10 * s + i), thresholds)
        for s, suite in enumerate(SUITES)
        for i in range(checks_per_suite)
    ]
    dtype = str(engine_dtype).removeprefix("torch.")
    failed = any(c.status == "fail" for c in checks)
    return Report(
        verdict="fail" if failed else "pass",
        created="2026-11-22T10:00:00+00:00",
        command=f"tim-conformance certify --engine-dtype {dtype} --seed {seed}",
        seed=seed,
        examples=10,
        depth="quick",
        stack=Stack(
            fingerprint=hashlib.sha256(dtype.encode()).hexdigest(),
            engine="hf-generate",
            backend="hf",
            engine_dtype=dtype,
            backend_dtype="float32",
            model={"path": "/tmp/model", "sha256": MODEL_SHA, "arch": "qwen2", "vocab_size": VOCAB},
            versions={"python": "3.11", "torch": torch.__version__},
            device={"kind": "cpu", "threads": 1},
            env={},
        ),
        profile=ProfileInfo(name="test", thresholds=dict(thresholds)),
        checks=checks,
    )
