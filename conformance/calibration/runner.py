"""Calibrate a tolerance profile by measurement, on the user's own model and device.

``tim-conformance calibrate --model DIR`` runs the reference stack — ``hf-generate`` (KV-cache
decode, left padding) in the engine precision against the ``hf`` backend's full forward in each
backend precision (by default fp32, and the engine's own precision where it is lower: a profile
covers both stacks) — on each model given, over rollout batches that span the depth: quick from
8 prompts × 32 new tokens to 32 × 128, deep up to 8 prompts × 2,048 new tokens. Each threshold
is the measured extreme times a safety factor (10 in fp32, where only kernel and reduction order
differ; 3 in bf16/fp16, whose rounding dominates), squared for the quadratic metrics (k2, k3, 1
− pcc), applied to the distance from the metric's ideal; community anchors replace the factor
where they are tighter but still above the measurement (verl's ``rollout_probs_diff_mean`` <
0.01, NeMo-RL's ``token_mult_prob_error`` < 1.05). Every metric is measured per batch, pooled
ones included: a suite pools one test's tokens, often a few hundred, and a mean over a few
hundred tokens strays further from its ideal than one over a whole model's batches. The smallest
batch's rollout tokens are the profile's ``min_pooled_tokens``: below it a pooled bound would be
judged outside what was measured. The measurement sits next to each number in the written TOML,
and its ``[provenance]`` table names the models (sha256), device, versions, sizes and seeds.

The shipped ``fp32``, ``bf16`` and ``fp16`` profiles are written by this same command on three
``make-model`` models (docs/profiles.md); each file's header holds the command."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.backends import BackendConfig
from conformance.engines import EngineConfig, SamplingSpec
from conformance.errors import UsageError
from conformance.guard import start
from conformance.hf_model import AUTO_ATTN, needs_eager
from conformance.host import device_info, package_versions
from conformance.metric_table import METRICS, Metric, metric
from conformance.models import inspect_model
from conformance.routing import routing_metrics
from conformance.strategies import RUN_LENGTHS, chat_text, in_runs, marker_ids
from conformance.suite_support import ROLLOUT_SUITES

if TYPE_CHECKING:
    import torch

    from conformance.backends import Recompute
    from conformance.engines import Completion, Engine
    from conformance.guard import Guarded
    from conformance.models import ModelInfo

#: (prompts, prompt length, new tokens) per depth: each depth's small, middle and large ends
DEPTH_BATCHES = {
    "quick": ((8, 64, 32), (32, 512, 128)),
    "deep": ((8, 64, 32), (32, 512, 128), (64, 256, 512), (8, 1024, 2048)),
}
SAMPLING_SEEDS = (0, 1)
#: the reference stack calibrate measures: registered engine and backend names
REFERENCE = ("hf-generate", "hf")
#: engine precision → safety factor on the worst measured distance from the ideal
FACTORS = {"float32": 10.0, "bfloat16": 3.0, "float16": 3.0}
#: a pool-scaled metric (|Σ log ρ|/√n) is one draw of ≈ σ·|Z| per batch, so its bound is also at
#: least this many σ, σ estimated as the rms of the draws: 7 keeps 4.6σ when the estimate from
#: 8 draws is at its 10th percentile (χ²₈: 0.66σ). Worst × 3 alone (bf16/fp16) sits at 3.6σ
#: or less one time in eight (all 8 draws under 1.2σ):
#: a sound llama fp16 stack's multi-turn check reached 77 % of such a bound (0.0056 / 0.0072)
Z_SIGMAS = 7.0
#: metrics whose scale is the square of a log-ratio: the factor is squared too
QUADRATIC = frozenset({"k2", "k3", "pcc"})
#: engine precision → metric → (threshold, source): used when tighter than factor × measured,
#: but above 1.5 × measured
ANCHORS = {
    "bfloat16": {
        "prob_diff_mean": (0.01, "verl FAQ: < 0.005 fine, > 0.01 bad"),
        "token_mult_prob_error": (1.05, "NeMo-RL / Megatron: < 1.05"),
    },
}
#: the ids a prompt is drawn from start past the embedded tokenizer's three special ids
FIRST_PROMPT_ID = 3
#: what calibrate measures, revised whenever that changes (cached own profiles are keyed by it,
#: so a change measures them again): 2 added the runs of one id, 3 the Z_SIGMAS floor, 4 keeps
#: the rollout suites' per-example and quadratic bounds at the base ones where routes flip, 5
#: leaves k3 and max |Δp| unbounded there (``exp_scale``), floored a sequence's bound at a token's
#: there (``Metric.one_token`` now floors it on every profile, when judged) and keeps the
#: rollout suites' pool-scaled bounds at the base ones too, 6 measures chat text on a model with
#: a chat template (``CHAT_EVERY``; a model without one measures what 5 did), 7 measures the
#: batches of every sampling seed but the first on random ids alone (``_batch_prompts``) and
#: bounds pcc by its bootstrap low quantile (``_metrics``), 8 leaves the ``exp_scale`` metrics
#: unbounded where a measured token's |log ρ| passes ``EXP_SCALE_RANGE`` and measures rollouts
#: from prompts of ``SHORT_LENGTHS`` tokens (``SHORT_EVERY``), 10 no longer measures the models
#: holding the weight-sync suite's new weights (that suite judges the engine against itself)
METHOD = 10
#: nats: past this measured max |log ρ|, ρ's moments are no reading of the log-ratio's
#: (ρ − 1 ≈ log ρ within 1 nat: e¹ = 2.7 against 2) but of the one largest token's e^{nats},
#: which a bigger pool or another kernel on the same inputs outgrows by orders of magnitude
#: (models 23 nats apart in bf16: vLLM's kernels read max ρ 2.3e7 against a calibrated 3e6
#: while every log-scale metric stayed within its own); the log-scale metrics bound them instead
EXP_SCALE_RANGE = 1.0
#: why a profile leaves the ``exp_scale`` metrics unbounded past ``EXP_SCALE_RANGE``
_PAST_RANGE = f"a token's |log ρ| passed {EXP_SCALE_RANGE:g} nat"
#: every this-many-th prompt is one id repeated, the id cycling through ``marker_ids``: the
#: suites draw such sequences first (the simplest ids), and on them a sound fp16 stack's
#: per-sequence |Σ log ρ|/√len reached 5× what random prompts had measured (0.082 vs 0.016)
CONSTANT_EVERY = 5
#: where the model has a chat template, every this-many-th of the other prompts of the first
#: sampling seed's batches is chat text (:func:`conformance.strategies.chat_text`), as the
#: suites draw it then: a trained model's
#: numbers on its own kind of text, not only on random ids, set its bounds
CHAT_EVERY = 2
#: every this-many-th prompt is cut to ``SHORT_LENGTHS`` tokens (cycling), the last a marker id:
#: the suites draw prompts from one token up with marker ids among them, and Hypothesis tries
#: the shortest first, while on a trained model the tokens decoded right there are the furthest
#: off in low precision. SmolLM2-135M, bf16 against fp32: max |Δ log p| 1.8 and 2.7 nats after
#: 1- and 2-token prompts against 0.18-0.34 after 3 to 64, and a mean 0.39-0.56 per token after
#: a prompt ending in a special id against 0.06-0.08. A sound bf16 stack failed rollout parity
#: under a profile measured on full-length prompts (a one-token rollout after [0] 1.17 nats,
#: seq bound 0.69; the pool's max 7.8 against 1.5) and passes under one measuring these
SHORT_EVERY = 4
SHORT_LENGTHS = (1, 2)

Batch = tuple[int, int, int]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """What one calibration measures: the models, the precisions, the batch sizes."""

    models: tuple[Path, ...]
    engine_dtype: str
    backend_dtypes: tuple[str, ...]
    depth: str = "quick"
    sampling_seeds: tuple[int, ...] = SAMPLING_SEEDS
    #: a run's own shape (prompts, prompt length, new tokens) that caps the depth's batches: a
    #: run certified at its own smaller shape is calibrated at it, never above the depth's
    cap: Batch | None = None
    #: the run's tokens per batch (``Depth.max_batch_tokens``): a batch above it is measured as
    #: the two the suites draw at the top sizes in its place (:func:`within_tokens`)
    max_tokens: int | None = None
    #: the attention implementation both sides of the reference stack load the model with: a
    #: stack's ``--backend-attn``, so a model that loads with one implementation only (eager
    #: for Gemma-2's soft-cap) is calibrated the way it is certified
    attn_implementation: str = AUTO_ATTN
    #: the format an engine stores its KV cache in (a ``floor.KV_CACHE_FORMATS`` key), None for
    #: the model's precision: the reference engine's keys and values are rounded to it
    #: (``floor.kv_rounded_attention``), as an engine caching in it computes
    kv_format: str | None = None

    @property
    def factor(self) -> float:
        """The safety factor on the measured worst: the precision's, or with a low-precision
        cache, whose rounding dominates as bf16's does, bf16's (3)."""
        return FACTORS["bfloat16"] if self.kv_format else FACTORS[self.engine_dtype]

    @property
    def batches(self) -> tuple[Batch, ...]:
        fitted: list[Batch] = []
        for batch in DEPTH_BATCHES[self.depth]:
            if self.cap is not None:
                prompts, length, new = (min(a, b) for a, b in zip(batch, self.cap, strict=True))
                batch = (prompts, length, new)
            fitted.extend(within_tokens(batch, self.max_tokens))
        # two batches capped to the same size would measure the same thing twice
        return tuple(dict.fromkeys(fitted))


def within_tokens(batch: Batch, max_tokens: int | None) -> tuple[Batch, ...]:
    """``batch`` (prompts, prompt length, new tokens), or where it holds more than
    ``max_tokens`` the two batches the suites draw at the top sizes in its place
    (``conformance.strategies.at_top_sizes``): its prompts at the length that fits (at least
    one token, the prompts as many as then fit), and its longest prompts in as many sequences
    as fit.

    >>> within_tokens((32, 512, 128), 4128)
    ((32, 1, 128), (6, 512, 128))
    """
    prompts, length, new = batch
    if max_tokens is None or prompts * (length + new) <= max_tokens:
        return (batch,)
    most = max(1, min(prompts, max_tokens // (1 + new)))
    return (
        (most, max(1, min(length, max_tokens // most - new)), new),
        (max(1, max_tokens // (length + new)), length, new),
    )


def default_backend_dtypes(engine_dtype: str) -> tuple[str, ...]:
    """fp32, and the engine's own precision where it is lower (a trainer runs in either)."""
    return ("float32",) if engine_dtype == "float32" else ("float32", engine_dtype)


def fitted_batches(plan: Plan, infos: Sequence[ModelInfo]) -> tuple[Batch, ...]:
    """The plan's batches within every model's context: the rollout kept to half of it, the
    prompt shortened so that prompt + rollout + one more position fit (engines rescore a
    sequence by generating one past it)."""
    contexts = [i.max_position_embeddings for i in infos if i.max_position_embeddings]
    if not contexts:
        return plan.batches
    context = min(contexts)
    fitted = []
    for prompts, length, new in plan.batches:
        new = min(new, context // 2)
        fitted.append((prompts, max(1, min(length, context - new - 1)), new))
    return tuple(fitted)


@dataclass
class Measured:
    """Every value one metric took, one per batch."""

    values: list[float]

    def worst(self, fact: Metric) -> float:
        return max(self.values, key=fact.deviation)

    def median(self) -> float:
        return statistics.median(self.values)


Measurements = dict[str, Measured]
#: what a calibration measures, kept apart: rollouts as decoded and whole sequences as scored in
#: one prefill
KINDS = ("decoded", "scored")


def measure(
    plan: Plan, progress: Progress = print
) -> tuple[dict[str, Measurements], list[ModelInfo]]:
    """Run the reference stack of ``plan`` on every model; every metric's values per
    :data:`KINDS`, and the models' :class:`~conformance.models.ModelInfo`.

    The engine serves each model's batches once (:func:`_engine_runs`) and every backend
    precision recomputes the same sequences: the rollouts do not depend on the backend."""
    import torch

    infos = [inspect_model(model) for model in plan.models]
    found: dict[str, dict[str, list[float]]] = {
        kind: {m.name: [] for m in METRICS} for kind in KINDS
    }
    batches = fitted_batches(plan, infos)
    # every model's reference is settled before the first is measured: a refusal costs nothing
    engine_attention = {info.path: _engine_attention(plan, info.path) for info in infos}
    steps = len(infos) * (1 + len(plan.backend_dtypes)) * len(batches) * len(plan.sampling_seeds)
    done, started = 0, time.perf_counter()

    def tick(what: str, run: _EngineRun) -> None:
        nonlocal done
        done += 1
        prompts, length, new = run.batch
        progress(
            f"[{done}/{steps}] {what}, {prompts} x ({length} + {new}) tokens, seed {run.seed}"
            f" ({time.perf_counter() - started:.0f} s)"
        )

    for info in infos:
        special = set(info.special_token_ids)
        ids = torch.tensor([i for i in range(FIRST_PROMPT_ID, info.vocab_size) if i not in special])
        markers = marker_ids(info.vocab_size, info.special_token_ids)
        chat = _chat_prompts(info)
        label = f"{info.arch} {info.path.name}"
        engine_config = EngineConfig(
            model=info.path,
            dtype=plan.engine_dtype,
            options={"attn_implementation": engine_attention[info.path]},
        )
        runs: list[_EngineRun] = []
        # the reference stack, started as every stack is (through the registry, guarded)
        eos = info.eos_token_id
        with closing(start("engine", REFERENCE[0], engine_config, eos_token_id=eos)) as engine:
            for run in _engine_runs(engine, ids, markers, batches, plan.sampling_seeds, chat):
                runs.append(run)
                tick(f"{plan.engine_dtype} engine, {label}", run)
        for backend_dtype in plan.backend_dtypes:
            backend_config = BackendConfig(
                model=info.path, dtype=backend_dtype, attn_implementation=plan.attn_implementation
            )
            # the engine closed first: a user's model may not fit twice
            with closing(start("backend", REFERENCE[1], backend_config)) as backend:
                for run in runs:
                    out = backend.recompute(run.sequences)
                    for kind, metrics in _measured(run, out).items():
                        for name, value in metrics.items():
                            found[kind][name].append(value)
                    tick(f"{backend_dtype} backend, {label}", run)
    return {
        kind: {name: Measured(values) for name, values in found[kind].items() if values}
        for kind in KINDS
    }, infos


@dataclass(frozen=True)
class _EngineRun:
    """One batch as the engine served it: its rollouts, and its scores of their whole
    sequences in one prefill."""

    batch: Batch
    seed: int
    completions: Sequence[Completion]
    scores: list[list[float]]

    @property
    def sequences(self) -> list[list[int]]:
        return [c.sequence for c in self.completions]


def _engine_attention(plan: Plan, model: Path) -> str:
    """The reference engine's attention implementation: the plan's, or with a KV format, SDPA
    over keys and values rounded to it (a model that runs eagerly only has no such reference:
    its eager attention lives in its own modeling code, which nothing here can wrap)."""
    from conformance.floor import kv_rounded_attention

    if plan.kv_format is None:
        return plan.attn_implementation
    runs = "eager only" if needs_eager(model) else plan.attn_implementation
    if runs not in (AUTO_ATTN, "sdpa"):
        raise UsageError(
            f"the reference of a cache in {plan.kv_format} rounds keys and values inside SDPA, and "
            f"{model}'s attention here is {runs}",
            "name a profile for this stack with --profile",
        )
    return kv_rounded_attention(plan.kv_format)


def _engine_runs(
    engine: Guarded[Engine],
    ids: torch.Tensor,
    markers: Sequence[int],
    batches: Sequence[Batch],
    seeds: Sequence[int],
    chat: Sequence[Sequence[int]] = (),
) -> Iterator[_EngineRun]:
    """Each batch size and sampling seed served once: a rollout batch of that size drawn from
    ``ids`` and the rendered ``chat`` prompts, sampled and then scored whole."""
    import torch

    for batch, (round_, seed) in itertools.product(batches, enumerate(seeds)):
        prompts, length, new = batch
        generator = torch.Generator().manual_seed(seed)
        drawn = torch.randint(0, len(ids), (prompts, length), generator=generator)
        # the suites' prompts repeat tokens in runs, and repetition drifts further in bf16 (a
        # sound llama stack's weight-sync check broke a profile measured on prompts without
        # it: 0.85 against 0.69)
        prompt_rows = _batch_prompts(ids[drawn].tolist(), markers, chat, round_)
        completions = engine.generate(prompt_rows, SamplingSpec(max_new_tokens=new, seed=seed))
        yield _EngineRun(batch, seed, completions, engine.score([c.sequence for c in completions]))


def _batch_prompts(
    rows: Sequence[list[int]], markers: Sequence[int], chat: Sequence[Sequence[int]], round_: int
) -> list[list[int]]:
    """The prompts (:func:`_prompt`) of a batch drawn for the ``round_``-th sampling seed: the
    first seed's batches mix in ``chat`` text and runs of repeated ids; the others' rows are
    random ids as drawn. The suites' examples can be random ids alone, and a trained model
    samples those from flat distributions whose probabilities vary less than after a repeated
    id or a question, so pcc (a correlation of probabilities) strays further from 1 there (a
    sound bf16 SmolLM2-135M stack: 0.9924 over 105 tokens of random ids, where batches mixing
    chat text and runs had measured 0.9997 at worst)."""
    if round_ == 0:
        prompts = [_prompt(i, row, markers, chat) for i, row in enumerate(rows)]
    else:
        prompts = [_prompt(i, row, markers, runs=(1,)) for i, row in enumerate(rows)]
    return [_shortened(i, prompt, markers) for i, prompt in enumerate(prompts)]


def _shortened(index: int, prompt: list[int], markers: Sequence[int]) -> list[int]:
    """Every ``SHORT_EVERY``-th prompt cut to its first ``SHORT_LENGTHS`` tokens, in turn, the
    last of them a marker id (cycling), as the strategies' shortest draws end."""
    if index % SHORT_EVERY != SHORT_EVERY - 1:
        return prompt
    turn = index // SHORT_EVERY
    length = SHORT_LENGTHS[turn % len(SHORT_LENGTHS)]
    return [*prompt[: length - 1], markers[turn % len(markers)]]


def _prompt(
    index: int,
    drawn: list[int],
    markers: Sequence[int],
    chat: Sequence[Sequence[int]] = (),
    runs: Sequence[int] = RUN_LENGTHS,
) -> list[int]:
    """A batch's ``index``-th prompt, as long as ``drawn``: every ``CONSTANT_EVERY``-th one id
    repeated (cycling through ``markers``); of the others, where ``chat`` holds rendered chat
    prompts, every ``CHAT_EVERY``-th chat text, each ending with the next of them; the rest
    ``drawn`` in runs of the lengths ``runs`` cycles through."""
    if index % CONSTANT_EVERY == CONSTANT_EVERY - 1:
        return [markers[index // CONSTANT_EVERY % len(markers)]] * len(drawn)
    if chat and index % CHAT_EVERY == 0:
        return chat_text(chat, index // CHAT_EVERY, len(drawn))
    return in_runs(drawn, runs[index % len(runs)])


def _measured(run: _EngineRun, out: Recompute) -> dict[str, dict[str, float]]:
    """Metrics of one batch against the backend's recompute ``out``: ``decoded``, of the
    sampled tokens as decoded (on an MoE model with their routing metrics), and ``scored``, of
    the whole sequences as scored in one prefill (what the prefill suite compares)."""
    import torch

    from conformance.suite_support import generated_routes, generated_rows

    lp_train, lp_infer, _ = generated_rows(run.completions, out.logprobs)
    decoded = _metrics(lp_train, lp_infer)
    if out.routes is not None:
        diffs = [
            (torch.tensor(t, dtype=torch.float64) - torch.tensor(i, dtype=torch.float64)).abs()
            for t, i in zip(lp_train, lp_infer, strict=True)
        ]
        decoded |= routing_metrics(*generated_routes(run.completions, out.routes), diffs)
    return {"decoded": decoded, "scored": _metrics(out.logprobs, run.scores)}


def _metrics(lp_train: Sequence[Any], lp_infer: Sequence[Any]) -> dict[str, float]:
    """One batch's mismatch metrics; its pcc is the lowest a pool of its size from the same
    stack reads one time in a hundred (:func:`~conformance.metrics.pcc_bootstrap_quantile`),
    since a suite's pool holds other tokens than the batch measured."""
    from conformance.metrics import mismatch_metrics, pcc_bootstrap_quantile, stack_ragged

    train, mask = stack_ragged(lp_train)
    infer, _ = stack_ragged(lp_infer)
    found = mismatch_metrics(train, infer, mask)
    found["pcc"] = min(found["pcc"], pcc_bootstrap_quantile(train, infer, mask))
    return found


def _chat_prompts(info: ModelInfo) -> tuple[tuple[int, ...], ...]:
    """The corpus rendered by the chat template of the model ``info`` describes; none where it
    has no template."""
    if not info.chat_template:
        return ()
    from transformers import AutoTokenizer

    from conformance.chat_prompts import rendered_prompts

    return rendered_prompts(AutoTokenizer.from_pretrained(info.path))


def threshold(fact: Metric, measured: Measured, plan: Plan) -> tuple[float, str]:
    """The bound and the comment that says where it comes from."""
    worst = measured.worst(fact)
    note = f"measured median {_num(fact, measured.median())}, worst {_num(fact, worst)}"
    if fact.name == "nonfinite_tokens":
        return 0.0, "a NaN/inf log-probability is never conformant"
    if fact.name == "exact_match_rate":
        return 0.0, f"not required: kernels differ ({note})"
    scale = plan.factor**2 if fact.name in QUADRATIC else plan.factor
    # a lower bound sits below the ideal; upper and two-sided bounds are written above it
    sign = -1.0 if fact.bound == "min" else 1.0
    bound = _round_up(fact.ideal + sign * scale * fact.deviation(worst), fact)
    if fact.pool_scaled:
        # each batch's value is one draw of ≈ σ·|Z|, and the worst of a few draws can sit low
        sigma = math.sqrt(statistics.fmean(v * v for v in measured.values))
        if Z_SIGMAS * sigma > bound:
            return _round_up(Z_SIGMAS * sigma, fact), f"{Z_SIGMAS:g} × rms {sigma:.3g}; {note}"
    anchor = ANCHORS.get(plan.engine_dtype, {}).get(fact.name)
    if anchor is not None:
        value, source = anchor
        margin = fact.deviation(value) / max(fact.deviation(worst), 1e-300)
        if fact.deviation(value) < fact.deviation(bound) and margin >= 1.5:
            return value, f"{source}; {note}"
    return bound, note


def provenance(plan: Plan, infos: Sequence[ModelInfo], command: str) -> dict[str, Any]:
    """What the profile was measured on, as its ``[provenance]`` table records it."""
    return {
        "command": command,
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "engine": "hf-generate",
        "backend": "hf",
        "engine_dtype": plan.engine_dtype,
        "backend_dtypes": list(plan.backend_dtypes),
        "depth": plan.depth,
        "attn_implementation": plan.attn_implementation,
        "kv_format": plan.kv_format,
        "batches": [list(batch) for batch in fitted_batches(plan, infos)],
        "sampling_seeds": list(plan.sampling_seeds),
        "factor": plan.factor,
        "device": device_info(),
        "versions": {k: v for k, v in package_versions().items() if v is not None},
        "models": [
            {
                "path": str(info.path),
                "sha256": info.sha256,
                "arch": info.arch,
                "vocab_size": info.vocab_size,
                "num_layers": info.num_layers,
                "hidden_size": info.hidden_size,
            }
            for info in infos
        ],
    }


def render_profile(plan: Plan, measured: dict[str, Measurements], origin: dict[str, Any]) -> str:
    """The profile TOML: a header saying how it was measured, one commented threshold per
    bounded metric of the models themselves (``measured`` by :data:`KINDS`: their decoded and
    scored measurements), a ``[suites.NAME]`` table for each rollout suite (the decoded ones
    alone, where tighter; where routes flip, not for the per-example, quadratic and
    pool-scaled bounds), and the ``[provenance]`` table ``origin``."""
    batches = [tuple(b) for b in origin["batches"]]
    prompts, _, new = min(batches, key=lambda b: b[0] * b[2])
    # a scored sequence's log-probs start at its second token
    largest_batch = max(batches, key=lambda b: b[0] * (b[1] + b[2] - 1))
    largest = largest_batch[0] * (largest_batch[1] + largest_batch[2] - 1)
    models = ", ".join(f"{m['arch']} ({Path(m['path']).name})" for m in origin["models"])
    description = (
        f"{_short(plan.engine_dtype)} engine vs {' and '.join(map(_short, plan.backend_dtypes))} "
        f"trainer, calibrated on {models}"
    )
    quadratic = ", ".join(sorted(QUADRATIC))
    lines = [
        f"# {description}",
        "# Calibrated by `tim-conformance calibrate` (conformance/calibration/runner.py): "
        "hf-generate (KV-cache decode, left",
        f"# padding) vs the hf backend's full forward, batches "
        f"{', '.join(f'{p}x({n}+{k})' for p, n, k in batches)} x {len(plan.sampling_seeds)} "
        f"sampling seeds, measured {origin['created'][:10]}.",
        f"# Threshold = worst measured distance from the ideal x {plan.factor:g} "
        f"({plan.factor:g}^2 for {quadratic}), rounded up",
        "# to two significant digits; signed metrics (rho_mean, k1, chi2_token) are bounded on "
        "both sides of their ideal.",
        f"# Rebuild: {origin['command']}",
        f"description = {_toml(description)}",
        f"min_pooled_tokens = {prompts * new}  # the smallest batch's rollout tokens "
        f"({prompts} x {new}): pooled bounds are judged from there",
        f"max_pooled_tokens = {largest}  # the largest batch's tokens scored in one prefill "
        f"({largest_batch[0]} x {sum(largest_batch[1:]) - 1}): past it the pool-scaled "
        "bounds grow as sqrt(n / it)",
        "",
    ]
    decoded, own = (
        _merged(*(measured.get(kind, {}) for kind in kinds)) for kinds in (("decoded",), KINDS)
    )
    flips = max(own.get("route_flip_tokens", Measured([0.0])).values) > 0
    base = _bounds(plan, own, flips)
    why = (
        "routes flip, and one flipped token moves it"
        if flips
        else f"{_PAST_RANGE}, and one such token moves it"
    )
    for name, (value, note) in base.items():
        if value is None:
            # a calibration bounds what it saw; one token's e^{nats} it cannot
            lines.append(
                f"# {name} not bounded: {why} by orders of magnitude or across [0, 1] "
                f"({note.split('; ')[-1]})"
            )
        else:
            lines.append(f"{name} = {value!r}  # {note}")
    tighter = _differing(_bounds(plan, decoded, flips), base)
    if flips:
        # one flipped token sets a sequence's extremes, squared a pool's quadratic metrics, and
        # undiluted (δ/√n) a pool-scaled sum, and the decoded rollouts are a few thousand tokens
        # that may hold none of the flips a suite's rollouts will (a sound bf16 MoE stack's
        # rollout max |Δlp| read 6.6 against 6.3, 3 × its calibration's decoded worst; a sound
        # fp16 one's |Σ log ρ|/√n 0.064 against 0.055, 7 × their rms, at --examples 100)
        tighter = {
            n: bound
            for n, bound in tighter.items()
            if metric(n).scope != "example" and n not in QUADRATIC and not metric(n).pool_scaled
        }
    for suite in ROLLOUT_SUITES if tighter else ():
        lines += [
            "",
            f"# The {suite} suite measures rollouts as decoded: bounded by the decoded rollouts "
            "alone, where they are tighter",
            "# than the whole sequences scored in one prefill (whose small systematic bias "
            "would hide a biased rollout).",
            f"[suites.{suite}]",
            *(f"{name} = {value!r}  # {note}" for name, (value, note) in tighter.items()),
        ]
    lines += ["", "[provenance]"]
    lines += [f"{k} = {_toml(v)}" for k, v in origin.items() if k != "models"]
    for model in origin["models"]:
        lines += ["", "[[provenance.models]]", *(f"{k} = {_toml(v)}" for k, v in model.items())]
    return "\n".join(lines) + "\n"


def _merged(*parts: Measurements) -> Measurements:
    """Each metric's values across ``parts``."""
    names = dict.fromkeys(name for part in parts for name in part)
    return {
        name: Measured([v for part in parts if name in part for v in part[name].values])
        for name in names
    }


def _differing(
    bounds: dict[str, tuple[float | None, str]], base: dict[str, tuple[float | None, str]]
) -> dict[str, tuple[float | None, str]]:
    """The bounds that differ from ``base``'s bounded ones. ``bounds`` measures a subset of
    what set ``base`` (the decoded rollouts), so a metric it leaves unbounded ``base`` leaves
    unbounded too."""
    return {
        name: (value, note)
        for name, (value, note) in bounds.items()
        if name in base and value != base[name][0] and base[name][0] is not None
    }


def _bounds(plan: Plan, measured: Measurements, flips: bool) -> dict[str, tuple[float | None, str]]:
    """Each bounded metric's threshold and note; ``None`` for the ``exp_scale`` metrics where
    routes flip or a token's |log ρ| passed ``EXP_SCALE_RANGE``."""
    bounds = {
        fact.name: threshold(fact, measured[fact.name], plan)
        for fact in METRICS
        if not fact.grows_with_length and fact.name in measured
    }
    tails = (
        "abs_diff_max" in measured
        and measured["abs_diff_max"].worst(metric("abs_diff_max")) > EXP_SCALE_RANGE
    )
    return {
        name: (None if (flips or tails) and metric(name).exp_scale else value, note)
        for name, (value, note) in bounds.items()
    }


def _toml(value: object) -> str:
    """A TOML value: strings, numbers, booleans, lists and inline tables (None dropped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # TOML basic strings take JSON's escapes
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{k} = {_toml(v)}" for k, v in value.items() if v is not None)
        return "{ " + ", ".join(items) + " }"
    return _toml(str(value))


def _short(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]


def _round_up(value: float, fact: Metric) -> float:
    """Two significant digits of the distance from the ideal, rounded away from the ideal."""
    deviation = fact.deviation(value)
    if deviation == 0:
        return fact.ideal
    digits = 1 - math.floor(math.log10(deviation))
    # less a hair: 3 × 0.1 is 0.30000000000000004, which must round to 0.3, not 0.31
    rounded = math.ceil(deviation * 10**digits * (1 - 1e-12)) / 10**digits
    return round(fact.ideal + math.copysign(rounded, value - fact.ideal), digits + 1)


def _num(fact: Metric, value: float) -> str:
    if fact.ideal == 1.0 and 0 < abs(value - 1) < 0.01:
        return f"1 {'+' if value > 1 else '-'} {abs(value - 1):.2g}"
    return f"{value:.3g}"
