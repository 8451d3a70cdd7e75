"""The support property held on every batch a run's engine samples, inside the check that
sampled it (:mod:`conformance.support_audit` does the audit; this keeps its books per check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from conformance.engines import LogprobKind
from conformance.metric_table import breach
from conformance.outcome import PropertyFailure, first_line
from conformance.support_audit import audit_key, audit_rollouts, sampled_batches

if TYPE_CHECKING:
    from conformance.backends import Backend
    from conformance.engines import Engine
    from conformance.guard import Guarded
    from conformance.profiles import Profile
    from conformance.recorder import Recorder


class SessionAudit:
    """Holds a sampled batch to the support property: counts its tokens in the running check
    (``support_tokens``, ``out_of_support_tokens``) and fails it on a token outside.

    A mixed batch (``generate_requests``) is held per request, to its own spec. Batches sampled
    without truncation, outside a check, or once engine or backend took new weights are not
    held, nor a batch the check already held and found clean (``CheckRecord.audited``).
    ``backend`` gives the run's backend, whose tempered distribution is the reference.
    """

    def __init__(
        self, recorder: Recorder, profile: Profile, backend: Callable[[], Backend]
    ) -> None:
        self._recorder = recorder
        self._profile = profile
        self._backend = backend

    def __call__(
        self, engine: Guarded[Engine], method: str, args: tuple[object, ...], result: object
    ) -> None:
        record = self._recorder.current
        batches = sampled_batches(method, args, result)
        if not batches or record is None:
            return
        backend = self._backend()
        if engine.weights_changed or backend.weights_changed:
            return
        audit = {
            "order": engine.capabilities.sampler_order,
            "margin": self._profile.bounds(record.suite).get("abs_diff_max", 0.0),
            "raw_logprobs": engine.inner.config.logprobs is LogprobKind.RAW,
        }
        for spec, completions, rows in batches:
            # a batch found clean is not held again; one with a token outside is, so its
            # failure repeats when Hypothesis replays it
            digest = audit_key(spec, completions, **audit)
            if digest in record.audited:
                continue
            try:
                found = audit_rollouts(backend, spec, completions, **audit)
            except NotImplementedError as exc:
                self._recorder.remark(f"sampled tokens' support not checked: {first_line(exc)}")
                return
            record.count(support_tokens=found.tokens, out_of_support_tokens=found.outside)
            if not found.outside:
                record.audited.add(digest)
                continue
            first = found.first
            if rows is not None:
                completion, rest = first.split(" ", 2)[1:]
                first = f"request {rows[int(completion)]}'s completion {rest}"
            outside = breach("out_of_support_tokens", found.outside, 0)
            raise PropertyFailure(
                f"engine {engine.name!r} {method}() gave {first} outside the stated "
                f"sampler's support ({found.outside} of {found.tokens} sampled tokens; "
                f"temperature {spec.temperature:g}, top_k {spec.top_k}, top_p "
                f"{spec.top_p:g}{f', min_p {spec.min_p:g}' if spec.min_p else ''}, "
                f"{engine.capabilities.sampler_order.value}): its processed probability "
                "is 0, so a trainer recomputing it gets -inf — check the order and masking "
                "of the engine's sampler (or declare its order as capabilities.sampler_order) "
                f"[{outside}]",
                outside,
            )
