"""Engine knobs in few engine starts: the variants that cover an engine's knob values, and the
bisection that names the knob behind a failing variant.

An engine declares its knobs (``capabilities.knobs``: option → :class:`~conformance.engines.Knob`).
Starting one engine per value costs a start per value (nine for vLLM, minutes each on a GPU).
Instead every value runs in one of at most :data:`MAX_VARIANTS` variant engines, each holding
several knobs off the configured values at once; only a variant that fails is taken apart, by
delta debugging on its minimal failing case, so a failure still names the knob.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from conformance.engines.base import Knob
from conformance.errors import UsageError

#: extra engine starts per run that the knob suite may spend on a passing engine
MAX_VARIANTS = 3


def cover(knobs: Mapping[str, Knob], *, budget: int = MAX_VARIANTS) -> list[dict[str, str]]:
    """The variants (option → value) that together hold every value of every knob.

    Knob by knob in declaration order, each value goes into the first variant that does not
    set that knob yet and agrees with the value's requirements, which it then sets too; a value
    some variant already holds (as another value's requirement) needs no place of its own. A
    knob with v values thus needs v variants, and the most values of any knob — plus what
    conflicting requirements add — is the number of engine starts.

    >>> cover({"a": Knob(("1", "2")), "b": Knob(("x",), requires={"a": "2"})})
    [{'a': '1'}, {'a': '2', 'b': 'x'}]

    Raises :class:`UsageError` when the values do not fit ``budget`` variants.
    """
    variants: list[dict[str, str]] = []
    for name, knob in knobs.items():
        for value in knob.values:
            if any(variant.get(name) == value for variant in variants):
                continue
            needs = with_requirements({name: value}, knobs)
            for variant in variants:
                if name not in variant and all(variant.get(k, v) == v for k, v in needs.items()):
                    variant.update(needs)
                    break
            else:
                if len(variants) == budget:
                    raise UsageError(
                        f"the knobs {sorted(knobs)} need more than {budget} variant engines "
                        f"(value {value!r} of {name} fits none)",
                        f"declare at most {budget} values per knob, with requirements that agree",
                    )
                variants.append(needs)
    return variants


def with_requirements(changes: Mapping[str, str], knobs: Mapping[str, Knob]) -> dict[str, str]:
    """``changes`` plus what their knobs require, and what that requires in turn (a part of a
    variant, started alone). A requirement that contradicts another is a ``UsageError``."""
    options = dict(changes)
    pending = list(changes)
    while pending:
        knob = knobs.get(pending.pop())
        for key, value in (knob.requires if knob else {}).items():
            if key not in options:
                options[key] = value
                pending.append(key)
            elif options[key] != value:
                raise UsageError(
                    f"knob requirements contradict each other: {key}={options[key]!r} and "
                    f"{key}={value!r} in {dict(changes)}",
                    "declare requirements that agree",
                )
    return options


def smallest_failing(
    changes: Mapping[str, str], fails: Callable[[dict[str, str]], bool]
) -> dict[str, str]:
    """A 1-minimal part of ``changes`` for which ``fails`` holds, given that it holds for all of
    them: removing any single option from the result makes it pass.

    Delta debugging (ddmin; Zeller & Hildebrandt, "Simplifying and Isolating Failure-Inducing
    Input", IEEE TSE 2002): test the halves, then their complements, then finer parts. One
    culprit among n options costs about 2·log2(n) calls; each part is tried once. The empty part
    is never tried (it is the configured engine, which the failure was measured against).

    >>> smallest_failing({"a": "1", "b": "2", "c": "3"}, lambda part: part.get("b") == "2")
    {'b': '2'}
    """
    items = list(changes.items())
    tried: dict[tuple[tuple[str, str], ...], bool] = {}

    def test(part: list[tuple[str, str]]) -> bool:
        key = tuple(part)
        if key not in tried:
            tried[key] = fails(dict(part))
        return tried[key]

    granularity = 2
    while len(items) >= 2:
        size = -(-len(items) // granularity)
        parts = [items[i : i + size] for i in range(0, len(items), size)]
        complements = [[x for x in items if x not in part] for part in parts]
        if failing := next((p for p in parts if test(p)), None):
            items, granularity = failing, 2
        elif len(parts) > 2 and (failing := next((c for c in complements if test(c)), None)):
            items, granularity = failing, max(granularity - 1, 2)
        elif granularity >= len(items):
            break
        else:
            granularity = min(2 * granularity, len(items))
    return dict(items)
