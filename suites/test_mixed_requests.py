"""Mixed requests in one batch: each request served under its own parameters.

An RL rollout server batches requests that differ: rollouts next to evaluation or scoring
traffic, a seed per request, some requests asking for top-k log-probs and others none. Engines
that batch them together apply each request's parameters per row, and bugs cross them over:
two concurrent requests, one asking for specific tokens' log-probs and one for top-k, corrupt
each other's log-probs, the text unaffected (vllm#51789); batches where only some requests set
top-k sample the others wrongly (vllm#14301). The engine gets a batch of requests
(``Engine.generate_requests``; a server several in flight at once) drawn to differ in
temperature, top-k, top-p, seed, ``max_new_tokens``, stop ids and top-logprob count (0 or
``TOP_LOGPROBS``), and:

- every request's reported log-probs hold the profile against the backend's recompute;
- where a request asks for top log-probs, they are the backend's top ``k``: each value within
  the profile's ``abs_diff_max`` of the backend's log-prob of that id, and no id left out that
  the backend ranks above the reported ones by more than twice that (``top_logprobs_abs_diff_max``
  recorded);
- every rollout ends as *its own* spec says — at its ``max_new_tokens`` or its own stop ids
  (the guard checks each answer, ``conformance.guard``) — and every sampled token lies in *its
  own* spec's support (the session's support audit holds each request to its spec);
- one request, drawn from the batch, served alone gives the same rollout: the same tokens and
  its log-probs within the profile. Where the two diverge, the common prefix's log-probs are
  held to the profile; a divergence after a common prefix whose log-probs are bitwise equal
  fails (the logits agreed, so the request got another seed or other parameters in the batch),
  and one after a prefix the batch changed numerically is recorded
  (``alone_token_divergences``), not failed: a batch-variant engine may flip a near-tie. An
  engine that cannot seed its sampling (``info()["seeded"]`` false: SGLang on CPU) skips this
  comparison, saying so.

Every request carries a distinct seed, so an engine serving one batch per parameter set (the
protocol's default, for engines that do not declare ``capabilities.mixed_requests``) serves
each request alone: the check passes and says its requests were never mixed.
"""

from dataclasses import replace

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.engines import Request
from conformance.metric_table import breach
from conformance.suite_support import generated_rows, prompt_batches, rollout_specs

#: requests per mixed batch (the depth's batch size caps it below)
MAX_REQUESTS = 6
#: the top-logprob count a request asks for, when it asks
TOP_LOGPROBS = 5


def _draw_requests(data, model, depth):
    _, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=depth.max_new_tokens, max_batch=MAX_REQUESTS),
        label="batch",
    )
    requests = []
    for index, prompt in enumerate(prompts):
        spec = data.draw(rollout_specs(model, depth), label=f"sampling {index}")
        asks = data.draw(st.sampled_from([0, TOP_LOGPROBS]), label=f"top_logprobs {index}")
        # distinct seeds, as rollout workers send them (the simplest draw gives all seed 0)
        spec = replace(spec, seed=(spec.seed + index) % 2**31)
        requests.append(Request(prompt, spec, top_logprobs=asks))
    return requests


def _check_top_logprobs(recorder, backend, requests, completions, margin):
    """The reported top log-probs against the backend's raw distribution; the largest
    difference is recorded, a top set or value off by more than the profile allows fails."""
    asked = [(r, c) for r, c in zip(requests, completions, strict=True) if r.top_logprobs]
    if not asked:
        return
    distributions = backend.next_token_logprobs([c.sequence for _, c in asked])
    worst = 0.0
    for (request, completion), logp in zip(asked, distributions, strict=True):
        start = len(completion.prompt) - 1
        for step, top in enumerate(completion.top_logprobs):
            row = torch.as_tensor(logp[start + step], dtype=torch.float64)
            ids = torch.tensor(list(top))
            reported = torch.tensor(list(top.values()), dtype=torch.float64)
            diff = float((reported - row[ids]).abs().max())
            # the backend's k-th value above every reported one: an id of the top k left out
            kth = float(row.topk(request.top_logprobs).values[-1])
            missing = kth - float(reported.min())
            worst = max(worst, diff)
            if diff > margin or missing > 2 * margin:
                recorder.note(top_logprobs_abs_diff_max=worst)
                index = requests.index(request)
                # the cause is named only where the evidence is there: another request's row
                # at this step holds the reported values
                theirs = _row_holding(backend, requests, completions, index, step, top, margin)
                cause = (
                    f" — they are request {theirs}'s at this step: a request's top-k log-probs "
                    "taken from another request's row (vllm#51789)"
                    if theirs is not None
                    else ""
                )
                recorder.fail(
                    f"request {index}'s top-{request.top_logprobs} log-probs at step {step} "
                    f"(position {start + 1 + step}, counting the prompt) are not the backend's: "
                    f"{diff:.3g} off at worst, the backend's {request.top_logprobs}-th ranked "
                    f"{missing:.3g} above the lowest reported (abs_diff_max bound "
                    f"{margin:.3g}){cause}",
                    # the other way to fail, a top-k id left out, has no one number
                    breach=breach("top_logprobs_abs_diff_max", diff, margin)
                    if diff > margin
                    else None,
                )
    recorder.note(top_logprobs_abs_diff_max=worst)


def _row_holding(backend, requests, completions, index, step, top, margin):
    """The index of another request whose backend distribution at ``step`` of its rollout
    gives request ``index``'s reported top log-probs ``top`` (id → value) within ``margin``;
    ``None`` where none does."""
    others = [(j, c) for j, c in enumerate(completions) if j != index and step < len(c.tokens)]
    if not others:
        return None
    rows = backend.next_token_logprobs([c.sequence for _, c in others])
    ids = torch.tensor(list(top))
    reported = torch.tensor(list(top.values()), dtype=torch.float64)
    for (j, completion), logp in zip(others, rows, strict=True):
        row = torch.as_tensor(logp[len(completion.prompt) - 1 + step], dtype=torch.float64)
        if float((reported - row[ids]).abs().max()) <= margin:
            return j
    return None


def _check_alone(recorder, engine, request, in_batch):
    """``request`` served alone against its completion in the mixed batch."""
    (alone,) = engine.generate_requests([request])
    common = next(
        (i for i, (a, b) in enumerate(zip(alone.tokens, in_batch.tokens, strict=False)) if a != b),
        min(len(alone.tokens), len(in_batch.tokens)),
    )
    diverged = alone.tokens != in_batch.tokens
    recorder.note(alone_token_divergences=float(diverged))
    if common:
        measured = recorder.measure(
            [alone.logprobs[:common]],
            [in_batch.logprobs[:common]],
            sides=("the request served alone's", "the request in the mixed batch's"),
            contexts=[alone.sequence[: len(alone.prompt) + common]],
        )
        recorder.check_profile(measured)
    if diverged and common and alone.logprobs[:common] == in_batch.logprobs[:common]:
        recorder.fail(
            f"a seeded request served in the mixed batch sampled other tokens than served "
            f"alone from step {common} on ({alone.tokens[common : common + 1]} alone), after "
            f"{common} steps of bitwise equal log-probs: the batch served it with another seed "
            "or other parameters (vllm#14301)",
            breach=breach("rollouts_changed_on_rerun", 1, 0),
        )


@given(data=st.data())
def test_mixed_requests(data, engine, backend, model, depth, profile, recorder):
    requests = _draw_requests(data, model, depth)
    target = data.draw(st.integers(0, len(requests) - 1), label="served alone")
    recorder.case(
        [r.prompt for r in requests],
        requests=[r.as_dict() for r in requests],
        target_index=target,
    )
    if not engine.capabilities.mixed_requests:
        recorder.remark(
            f"engine {engine.name!r} does not declare capabilities.mixed_requests: its requests "
            "were served one batch per parameter set, not mixed"
        )

    completions = engine.generate_requests(requests)
    sequences = [c.sequence for c in completions]
    lp_train, lp_infer, positions = generated_rows(
        completions, backend.recompute(sequences).logprobs
    )
    recorder.check_profile(
        recorder.measure(lp_train, lp_infer, positions=positions, contexts=sequences)
    )
    margin = profile.bounds("mixed_requests").get("abs_diff_max", 0.0)
    _check_top_logprobs(recorder, backend, requests, completions, margin)
    if engine.info().get("seeded") is False:
        recorder.remark(
            f"engine {engine.name!r} cannot seed its sampling (its info() says so): no request "
            "was compared with itself served alone"
        )
    else:
        _check_alone(recorder, engine, requests[target], completions[target])
