"""GRPO groups from one request: n samples per prompt on the engine's own path.

verl's ``rollout.n``, SGLang's ``n`` and vLLM's ``SamplingParams(n=...)`` fork one request into
n children (``SamplingSpec.n``). A group's advantages are its rewards against their mean, so n
identical children — each child's random stream derived from the request's seed and the prompt
alone (tt-metal#53077 "this breaks GRPO training", llama.cpp#18700) — make every advantage zero
and the step learn nothing, while every child's log-probs are right. For each spec, P prompts
with n children each:

- every child's reported log-probs hold the profile against the backend's recompute;
- **group independence**: no two children of a request are identical on a sequence that
  independent draws would make identical less often than the test's share ``α`` of
  ``GROUP_FALSE_ALARMS_PER_RUN``. With ``p(s)`` the backend's processed probability of a
  child's sequence (raised by the profile's per-token bound), a pair alarms when
  ``p(s) < τ = α / (P·C(n, 2))``. For independent children the chance that a pair of a group is
  identical on some ``s`` with ``p(s) < τ`` is at most ``C(n, 2) Σ_{p(s)<τ} p(s)² ≤ C(n, 2)·τ``,
  so the test alarms on a sound engine with probability at most ``α``: the false-alarm rate is
  bounded, whatever the model (a peaked one, whose children coincide often, has large ``p(s)``
  and no alarm). The identical pairs and the number independent draws predict (``Σ C(n, 2)·q̂``,
  ``q̂`` the mean backend probability ``q(s)`` of a group's children, not raised: an unbiased
  estimate of its collision probability ``Σ_s q(s)²``) are recorded;
- a seeded request repeats as a whole: every child's tokens again.
"""

import math

import pytest
import torch

from conformance.engines import SamplingSpec
from conformance.metric_table import GROUP_FALSE_ALARMS_PER_RUN, breach
from conformance.suite_support import generated_rows, sample_groups

#: a plain spec and RL's filtered one, colder than 1
SPECS = {
    "default": {},
    "top_k_top_p": {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
}
PROMPTS, PROMPT_LEN, CHILDREN, NEW_TOKENS = 8, 8, 8, 16
#: each test's share of the run's false alarms
ALPHA = GROUP_FALSE_ALARMS_PER_RUN / len(SPECS)


@pytest.mark.parametrize("sampling", SPECS.values(), ids=SPECS.keys())
def test_group_children_are_independent_draws(
    sampling, engine, backend, model, profile, recorder, tim
):
    generator = torch.Generator().manual_seed(tim.seed)
    prompts = torch.randint(0, model.vocab_size, (PROMPTS, PROMPT_LEN), generator=generator)
    prompts = prompts.tolist()
    spec = SamplingSpec(max_new_tokens=NEW_TOKENS, seed=tim.seed % 2**31, n=CHILDREN, **sampling)
    recorder.case(prompts, sampling=spec)

    children = sample_groups(engine, prompts, spec, recorder)
    sequences = [c.sequence for c in children]
    raw = backend.recompute(sequences).logprobs
    lp_train, lp_infer, positions = generated_rows(children, raw)
    measured = recorder.measure(lp_train, lp_infer, positions=positions, contexts=sequences)

    processed = backend.recompute(
        sequences, temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p
    ).logprobs
    slack = 2.0 * profile.bounds("group_sampling").get("abs_diff_max", 0.0) / spec.temperature
    # log p(s) of each child's sequence, raised by what the profile lets engine and backend
    # differ per token (tempered, and twice: the normaliser moves too)
    per_token, _, _ = generated_rows(children, processed)
    log_q = [sum(row) for row in per_token]
    log_p = [q + slack * len(row) for q, row in zip(log_q, per_token, strict=True)]
    pairs = math.comb(CHILDREN, 2)
    log_tau = math.log(ALPHA / (PROMPTS * pairs))
    identical, improbable, expected, alarm = 0, 0, 0.0, ""
    for group in range(PROMPTS):
        members = range(group * CHILDREN, (group + 1) * CHILDREN)
        # the prediction from the backend's own probabilities (the slack is the alarm's margin)
        expected += pairs * sum(math.exp(log_q[j]) for j in members) / CHILDREN
        for j in members:
            for k in range(j + 1, members.stop):
                if children[j].tokens == children[k].tokens:
                    identical += 1
                    improbable += log_p[j] < log_tau
                    if log_p[j] < log_tau and not alarm:
                        alarm = (
                            f"children {j % CHILDREN} and {k % CHILDREN} of prompt {group} are "
                            f"identical, a sequence of probability e^{log_p[j]:.1f} "
                        )
    recorder.note(identical_child_pairs=float(identical), expected_identical_pairs=expected)
    if alarm:
        recorder.fail(
            f"the n={CHILDREN} children of a request are not independent draws: {alarm}"
            f"(independent draws repeat it with probability < {ALPHA:.0e} in the whole run); "
            f"{identical} identical pairs of {PROMPTS * pairs}, {expected:.2g} expected — each "
            "child needs its own random stream (seed + child index, as vLLM does)",
            breach=breach("improbable_identical_children", improbable, 0),
        )
    recorder.check_profile(measured)

    if engine.info().get("seeded") is False:
        return
    again = sample_groups(engine, prompts, spec)
    changed = [
        row for row, (a, b) in enumerate(zip(children, again, strict=True)) if a.tokens != b.tokens
    ]
    if changed:
        row = changed[0]
        recorder.fail(
            f"the same seeded request of n={CHILDREN} samples gave other children: child "
            f"{row % CHILDREN} of prompt {row // CHILDREN} differs — a seeded request must "
            "repeat as a whole",
            breach=breach("rollouts_changed_on_rerun", len(changed), 0),
        )
