"""Which of the model's features a run's checks reached (:mod:`conformance.models.features`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from conformance.models.features import ModelFeature
from conformance.report.schema import Check, FeatureCoverage


def feature_coverage(
    features: Iterable[ModelFeature], checks: Sequence[Check]
) -> list[FeatureCoverage]:
    """Each feature with the checks that reached it: checks held to a bound (judged pass or
    fail) whose longest drawn sequence (``reached["sequence_len"]``) exercised it."""
    judged = [c for c in checks if c.judgement in ("pass", "fail")]
    return [
        FeatureCoverage(
            name=feature.name,
            what=feature.what,
            from_position=feature.from_position,
            reached_by=[
                c.nodeid for c in judged if feature.reached_by(c.reached.get("sequence_len", 0))
            ],
        )
        for feature in features
    ]


def unreached_reason(unreached: Sequence[FeatureCoverage], checks: Sequence[Check]) -> str:
    """The verdict's reason for a run that left features unexercised: which, and how far the
    checks reached."""
    longest = max((c.reached.get("sequence_len", 0) for c in checks), default=0)
    named = "; ".join(f"{f.what} (acts from position {f.from_position})" for f in unreached)
    return (
        f"coverage: no check reached the model's {named}; the longest sequence drawn held "
        f"{longest} tokens (draw longer ones: --max-prompt-len, --max-new-tokens or --depth deep)"
    )
