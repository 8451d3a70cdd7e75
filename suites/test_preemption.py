"""Preemption under a full KV budget: a batch that needs more KV cache than the engine has.

RL rollout servers run with their KV cache full: when a running request needs a block and none
is free, vLLM preempts a request (frees its cache, recomputes it later from its prompt and the
tokens it has sampled) and SGLang retracts one. The recomputed request must go on as if nothing
happened, and real engines have not: vllm#19940 re-created a seeded request's generator after a
preemption (its later tokens drawn from a re-seeded stream), vllm#29071 broke prompt log-probs
under preemption with chunked prefill, sglang#20724 returned K + N log-probs for N tokens after
a retraction (only on the larger model, the one that hit memory pressure). Every other suite runs
with KV room to spare.

The engine declares the option that bounds its KV cache in tokens
(``capabilities.kv_budget_option``); a variant of it gets a budget of ``BUDGET`` tokens and a
seeded batch of ``REQUESTS`` requests, each needing ``PROMPT_LEN + NEW_TOKENS`` tokens of cache
(less than the budget, so each can run) and together
``REQUESTS · (PROMPT_LEN + NEW_TOKENS) ≥ 3 · BUDGET``. The engine's own count
(``Engine.preemptions()``) confirms that requests were preempted or retracted, or the check says
it could not tell (or that the engine served the batch without evicting any). On that batch:

- **parity**: the reported log-probs hold the profile against the backend's recompute;
- **decode vs prefill**: they hold it against the same engine's scoring of the finished
  sequences in one prefill (a recomputed request's decode resumes from a prefill of its prompt
  and tokens so far, so a misaligned resume shows here), scored by the budgeted variant, whose
  cache they overflow as well (prompt log-probs under a full cache; its preemptions are
  recorded as ``scoring_preemptions``);
- **seeded reproducibility** (engines that seed their sampling, ``info()["seeded"]``): served
  again under the budget, the batch gives the same tokens; and, where scheduling cannot move
  the numbers (an fp32 engine: the determinism suite's bitwise rule for repeated tokens, since
  a batch's composition changes its rounding below fp32), the stack's own engine, which has
  the room to serve the batch without preempting, gives the same tokens too.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conformance.engines import SamplingSpec
from conformance.metric_table import breach
from conformance.suite_support import generated_rows

#: the variant's KV budget in tokens: two of vLLM-CPU's 128-token blocks
BUDGET = 256
#: each request's need, PROMPT_LEN + NEW_TOKENS = 160, crosses a 128-token block mid-rollout
#: and fits the budget; six of them need 960 tokens, 3.75 budgets
PROMPT_LEN, NEW_TOKENS, REQUESTS = 96, 64, 6

#: the served batch, per session: (variant, completions, preemptions)
_SERVED: dict[int, tuple[Any, list[Any], int | None]] = {}


def served(tim: Any, engine: Any, model: Any, recorder: Any) -> tuple[Any, ...]:
    """The budgeted variant and the seeded batch it served (once per session), announced as the
    running check's case, its preemptions noted or the lack of a count remarked."""
    declared = engine.capabilities
    if declared.kv_budget_option is None:
        pytest.skip(
            f"engine {engine.name!r} declares no option bounding its KV cache "
            "(capabilities.kv_budget_option)"
        )
    generator = torch.Generator().manual_seed(tim.seed)
    prompts = torch.randint(0, model.vocab_size, (REQUESTS, PROMPT_LEN), generator=generator)
    prompts = prompts.tolist()
    spec = SamplingSpec(max_new_tokens=NEW_TOKENS, seed=tim.seed % 2**31)
    # announced before the engine runs: a failure inside it still has its case
    recorder.case(prompts, sampling=spec, kv_budget_tokens=BUDGET)
    recorder.describe(**{declared.kv_budget_option: BUDGET})
    if id(tim) not in _SERVED:
        budget = {**declared.kv_budget_requires, declared.kv_budget_option: str(BUDGET)}
        variant = tim.engine_variant(**budget)
        before = variant.preemptions()
        completions = variant.generate(prompts, spec)
        after = variant.preemptions()
        count = None if before is None or after is None else after - before
        _SERVED[id(tim)] = (variant, completions, count)
    variant, completions, count = _SERVED[id(tim)]
    if count is None:
        recorder.remark(
            f"engine {engine.name!r} cannot tell whether it preempted requests "
            f"(preemptions() is None): the batch needed {REQUESTS * (PROMPT_LEN + NEW_TOKENS)} "
            f"KV tokens of a {BUDGET}-token budget"
        )
    else:
        recorder.note(preemptions=float(count))
        if count == 0:
            recorder.remark(
                f"engine {engine.name!r} served a batch needing "
                f"{REQUESTS * (PROMPT_LEN + NEW_TOKENS)} KV tokens within a {BUDGET}-token budget "
                "without preempting a request: the properties held on its waves, not on "
                "recomputed requests"
            )
    return variant, prompts, spec, completions


def test_preempted_rollouts_hold_parity(tim, engine, backend, model, recorder):
    _, _, _, completions = served(tim, engine, model, recorder)
    sequences = [c.sequence for c in completions]
    lp_train, lp_infer, positions = generated_rows(
        completions, backend.recompute(sequences).logprobs
    )
    recorder.check_profile(
        recorder.measure(lp_train, lp_infer, positions=positions, contexts=sequences)
    )


def test_preempted_rollouts_decode_as_they_prefill(tim, engine, model, recorder):
    variant, _, _, completions = served(tim, engine, model, recorder)
    sequences = [c.sequence for c in completions]
    # the finished sequences need the budget 3.75 times over too: prompt log-probs under a
    # full cache (vllm#29071), whose preemptions are counted apart
    before = variant.preemptions()
    scored = variant.score(sequences)
    after = variant.preemptions()
    if before is not None and after is not None:
        recorder.note(scoring_preemptions=float(after - before))
    lp_prefill, lp_decode, positions = generated_rows(completions, scored)
    sides = ("the engine's prefill", "the engine's decode")
    recorder.check_profile(
        recorder.measure(
            lp_prefill, lp_decode, positions=positions, sides=sides, contexts=sequences
        )
    )


def test_preempted_seeded_rollouts_repeat(tim, engine, model, recorder):
    variant, prompts, spec, completions = served(tim, engine, model, recorder)
    if engine.info().get("seeded") is False:
        pytest.skip(f"engine {engine.name!r} cannot seed its sampling (its info() says so)")
    runs = {"served again under the budget": variant.generate(prompts, spec)}
    if engine.config.dtype == "float32":
        runs["served by the stack's own engine, with room to spare"] = engine.generate(
            prompts, spec
        )
    else:
        recorder.remark(
            f"tokens not compared with the stack's own engine: at {engine.config.dtype} a "
            "batch's schedule may move its rounding"
        )
    for how, again in runs.items():
        changed = [
            row
            for row, (a, b) in enumerate(zip(completions, again, strict=True))
            if a.tokens != b.tokens
        ]
        if changed:
            a, b = completions[changed[0]].tokens, again[changed[0]].tokens
            step = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            recorder.fail(
                f"the same seeded batch, {how}, sampled other tokens: request {changed[0]} "
                f"diverges at token {step} of {len(a)} — a preempted request must go on with "
                "its own random stream where it stopped (vllm#19940 re-created it from the "
                "seed)",
                breach=breach("rollouts_changed_on_rerun", len(changed), 0),
            )
