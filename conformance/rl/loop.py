"""The smoke run: GRPO through the real engine and backend, streaming ``rl.jsonl``.

Each step: the engine samples ``group`` responses per prompt with its own log-probs; the backend
recomputes them at the rollout weights (``lp_old``, as verl recomputes old log-probs; it gives
ρ = exp(lp_old − lp_infer) and the entropy); then ``updates_per_step`` optimizer steps, each on
the next contiguous 1/K of the batch, through the Backend training protocol
(``Backend.update``, loss ``conformance.training.policy_loss``); the new weights go into the
engine (``Backend.state_dict`` → ``Engine.load_weights``). The importance ratio's old policy is
``lp_old`` (``old_logprobs="recompute"``: with K = 1 the ratio is 1 and the mismatch acts only
through the sampling distribution, objective-level-hacking Eq. 4, 8) or the engine's log-probs
(``"engine"``: the mismatch enters the ratio and its clip directly). The IS remedies weight
tokens by ρ (``grpo.remedy_weights``); ``gspo`` clips one ratio per sequence.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch
from torch.nn.utils.rnn import pad_sequence

from conformance.backends import Backend
from conformance.engines import Engine, SamplingSpec
from conformance.errors import UsageError
from conformance.guard import started
from conformance.metrics import mismatch_metrics, rho_by_prob_bin
from conformance.models import inspect_model
from conformance.profiles import Profile
from conformance.rl import grpo
from conformance.rl.detectors import (
    CollapseRules,
    MismatchRules,
    Verdict,
    collapse,
    lead_steps,
    mismatch_alarm,
)
from conformance.rl.options import OLD_LOGPROBS, UPDATES_PER_STEP
from conformance.rl.scenarios import Scenario
from conformance.rl.schedules import FLOOR_FRACTION, LengthDecaySchedule
from conformance.rl.task import CountingTask, counting_task, position_reward
from conformance.rl.warmstart import warm_start
from conformance.stack import StackSpec
from conformance.training import (
    Objective,
    PolicyBatch,
    response_logprobs,
    response_mask,
    step_stats,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: ρ outside [1/OUTSIDE_BAND, OUTSIDE_BAND] counts as extreme (the TIS/MIS cap C = 2)
OUTSIDE_BAND = 2.0


@dataclass(frozen=True)
class RunConfig:
    """Everything that sets a smoke run apart from another on the same stack."""

    scenario: Scenario = field(default_factory=lambda: Scenario("natural"))
    remedy: str = "none"
    steps: int = 60
    seed: int = 0
    lr: float = 3e-4
    prompts: int = 8
    group: int = 4
    warm_steps: int = 20
    warm_lr: float = 3e-3
    long: bool = False
    #: K: optimizer updates per rollout batch, each on the next contiguous 1/K of it
    updates_per_step: int = UPDATES_PER_STEP
    #: the ratio's old policy: "recompute" (the trainer at the rollout weights) or "engine"
    old_logprobs: str = OLD_LOGPROBS[0]
    #: ratio clip range (None: the objective's default, 0.2 / 0.2, GSPO 3e-4 / 4e-4)
    clip_low: float | None = None
    clip_high: float | None = None
    #: the stack's tolerance profile: the alarm's level rule (None: not consulted)
    profile: Profile | None = None
    mismatch_rules: MismatchRules = field(default_factory=MismatchRules)
    collapse_rules: CollapseRules = field(default_factory=CollapseRules)

    def __post_init__(self) -> None:
        if self.remedy not in grpo.REMEDIES:
            raise UsageError(
                f"unknown remedy {self.remedy!r}", f"choose one of: {', '.join(grpo.REMEDIES)}"
            )
        if self.steps < 1 or self.prompts < 1 or self.group < 2 or self.warm_steps < 0:
            raise UsageError(
                f"steps={self.steps} prompts={self.prompts} group={self.group}",
                "use steps >= 1, prompts >= 1, group >= 2, warm steps >= 0",
            )
        if not 1 <= self.updates_per_step <= self.prompts * self.group:
            raise UsageError(
                f"--updates-per-step {self.updates_per_step} with {self.prompts * self.group} "
                "responses per step",
                "use 1 <= K <= prompts × group (each update needs at least one response)",
            )
        if self.old_logprobs not in OLD_LOGPROBS:
            raise UsageError(
                f"--old-logprobs {self.old_logprobs!r}", f"use one of: {', '.join(OLD_LOGPROBS)}"
            )
        self.objective  # noqa: B018 — validates the clip range up front

    @property
    def objective(self) -> Objective:
        kind = "seq-clip" if self.remedy == "gspo" else "token-clip"
        return Objective(kind, self.clip_low, self.clip_high)


@dataclass(frozen=True)
class RLSummary:
    scenario: str
    remedy: str
    seed: int
    steps: int
    mismatch_alarm: Verdict
    collapse: Verdict
    #: the training regime: updates per rollout batch, the ratio's old policy, the clip range
    updates_per_step: int = UPDATES_PER_STEP
    old_logprobs: str = OLD_LOGPROBS[0]
    clip_low: float = 0.0
    clip_high: float = 0.0

    @property
    def lead_steps(self) -> int | None:
        return lead_steps(self.mismatch_alarm, self.collapse)

    @property
    def exit_code(self) -> int:
        """0 when neither verdict fired, 1 when either did (issue 6)."""
        return int(self.mismatch_alarm.fired or self.collapse.fired)

    def as_dict(self) -> dict[str, Any]:
        """Every field, the verdicts in their summary form, and ``lead_steps``."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {
            **values,
            "mismatch_alarm": self.mismatch_alarm.as_dict(),
            "collapse": self.collapse.as_dict(),
            "lead_steps": self.lead_steps,
        }


def task_for(backend: Backend, long: bool) -> CountingTask:
    info = inspect_model(backend.config.model)
    if info.eos_token_id is None:
        raise UsageError(
            "the backend's model declares no eos_token_id", "use a model whose config sets one"
        )
    special = [s for s in (info.bos_token_id, info.pad_token_id) if s is not None]
    return counting_task(info.vocab_size, info.eos_token_id, special, long=long)


def run_smoke(engine: Engine, backend: Backend, config: RunConfig, out_dir: Path) -> RLSummary:
    """Run ``config`` on the stack; stream ``out_dir/rl.jsonl``, write ``rl-summary.json``."""
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    task = task_for(backend, config.long)
    trained(warm_start, backend, task, steps=config.warm_steps, lr=config.warm_lr, rng=rng)
    sync(engine, trained(backend.state_dict))
    decay = LengthDecaySchedule(config.lr) if config.remedy == "lr-decay" else None
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with (out_dir / "rl.jsonl").open("w") as stream:
        for step in range(config.steps):
            lengths = [r["response_length"] for r in rows]
            base_lr = decay.lr(step, lengths) if decay else config.lr
            if config.remedy == "lr-low":
                base_lr *= FLOOR_FRACTION
            lr = base_lr * config.scenario.lr_factor(step)
            row = rl_step(engine, backend, task, config, step, lr, rng, generator)
            rows.append(row)
            stream.write(json.dumps(row) + "\n")
            stream.flush()
    summary = RLSummary(
        scenario=config.scenario.name,
        remedy=config.remedy,
        seed=config.seed,
        steps=config.steps,
        mismatch_alarm=mismatch_alarm(rows, config.mismatch_rules, config.profile),
        collapse=collapse(rows, config.collapse_rules),
        updates_per_step=config.updates_per_step,
        old_logprobs=config.old_logprobs,
        clip_low=config.objective.eps[0],
        clip_high=config.objective.eps[1],
    )
    (out_dir / "rl-summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    return summary


@contextmanager
def started_stack(spec: StackSpec) -> Iterator[tuple[Engine, Backend]]:
    """A fresh engine and backend for ``spec`` (a smoke run trains, so it changes both),
    started and guarded as the suites' are (:func:`conformance.guard.started`) and closed when
    the block ends."""
    model = spec.model_dir()
    with started(
        spec.engine,
        spec.engine_config(model),
        spec.backend,
        spec.backend_config(model),
        start_timeout=spec.start_timeout,
        call_timeout=spec.call_timeout,
        # a rollout that stops ends at the model's EOS (the guard holds it to that)
        eos_token_id=inspect_model(model).eos_token_id,
    ) as stack:
        yield stack


def sync(engine: Engine, state: Mapping[str, torch.Tensor]) -> None:
    """Push trainer weights into the engine; an engine that cannot take them is refused."""
    try:
        engine.load_weights(state)
    except NotImplementedError as exc:
        # an Unsupported names its own fix, which is not the one for rl-smoke
        problem = getattr(exc, "problem", str(exc))
        raise UsageError(problem, "run rl-smoke with an engine that has load_weights") from exc


def trained(call: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``call(...)`` on the backend's training protocol; a backend without it is refused."""
    try:
        return call(*args, **kwargs)
    except NotImplementedError as exc:
        raise UsageError(str(exc), "run rl-smoke with a backend that can train (hf)") from exc


def rl_step(
    engine: Engine,
    backend: Backend,
    task: CountingTask,
    config: RunConfig,
    step: int,
    lr: float,
    rng: random.Random,
    generator: torch.Generator,
) -> dict[str, Any]:
    """One GRPO step (a rollout batch, K updates, a weight sync); returns its ``rl.jsonl`` row."""
    started = time.perf_counter()
    problems = [p for p in task.problems(config.prompts, rng) for _ in range(config.group)]
    spec = SamplingSpec(
        max_new_tokens=task.max_new_tokens,
        seed=config.seed * 1_000_003 + step,
        ignore_eos=False,
    )
    completions = engine.generate([p.prompt for p in problems], spec)
    pairs = list(zip(completions, problems, strict=True))
    rewards = torch.tensor([position_reward(c.tokens, p.target) for c, p in pairs])
    accuracy = statistics.mean(float(c.tokens == p.target) for c, p in pairs)
    advantages = grpo.group_advantages(rewards.view(config.prompts, config.group)).view(-1)

    sequences = tuple(tuple(c.sequence) for c in completions)
    prompt_lengths = tuple(len(p.prompt) for p in problems)
    # a backend with routing replay recomputes, and trains, with the experts the engine chose;
    # a dense model's rollouts pass none (so a backend written before routes still runs)
    routes = tuple(c.routes for c in completions)
    moe = any(r is not None for r in routes)
    out = backend.recompute(sequences, **({"routes": routes} if moe else {}))
    lp_old = response_logprobs(out.logprobs, prompt_lengths).float()
    entropy = response_logprobs(out.entropy, prompt_lengths)
    lengths = torch.tensor([len(c.tokens) for c in completions])
    mask = response_mask(lengths, lp_old.shape[1])
    engine_lp = pad_sequence([torch.tensor(c.logprobs) for c in completions], batch_first=True)
    lp_infer = config.scenario.rollout_logprobs(step, engine_lp.to(lp_old.dtype), lp_old)

    weights = config.scenario.token_weights(step, lp_old.exp(), generator)
    remedy_w = grpo.remedy_weights(config.remedy, lp_old, lp_infer, mask)
    if remedy_w is not None:
        weights = remedy_w if weights is None else weights * remedy_w
    batch = PolicyBatch(
        sequences=sequences,
        prompt_lengths=prompt_lengths,
        objective=config.objective,
        lr=lr,
        old_logprobs=lp_infer if config.old_logprobs == "engine" else lp_old,
        advantages=advantages.float(),
        weights=weights,
        routes=routes if moe else None,
    )
    updates = [trained(backend.update, mb) for mb in batch.minibatches(config.updates_per_step)]
    sync(engine, config.scenario.engine_weights(step, trained(backend.state_dict), generator))

    rho = grpo.rho(lp_old, lp_infer, mask)
    outside = ((rho > OUTSIDE_BAND) | (rho < 1 / OUTSIDE_BAND)) & mask
    return {
        "step": step,
        "lr": lr,
        "reward": float(rewards.mean()),
        "accuracy": accuracy,
        "entropy": float(entropy[mask].mean()),
        **step_stats(updates),
        "response_length": float(lengths.float().mean()),
        "eos_rate": statistics.mean(c.finish_reason == "stop" for c in completions),
        "J": grpo.hacking_signal(advantages, lp_old.exp(), mask),
        "rho_outside_frac": float(outside.sum() / mask.sum()),
        "injected": config.scenario.level(step),
        "mismatch": mismatch_metrics(lp_old, lp_infer, mask),
        "rho_by_bin": rho_by_prob_bin(lp_old, lp_infer, mask),
        "seconds": time.perf_counter() - started,
    }
