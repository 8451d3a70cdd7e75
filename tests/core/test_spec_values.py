"""A stack spec as values: the values a spec spells resolve, through the options' own converters,
to the same spec; a certificate's recorded ``spec``, its older ``stack_args`` and, older still,
its stack's fields name the stack ``tim-conformance check`` rebuilds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.certificate import certified_values
from conformance.engines import LogprobKind
from conformance.options import STACK_OPTIONS, flags, resolve
from conformance.stack import StackSpec

#: a stack far from the defaults: every kind of converted value differs from its default
GIVEN = {
    "tim_engine": "tests.support.engines:OffByOne",
    "tim_engine_dtype": "bf16",
    "tim_backend_dtype": "fp32",
    "tim_profile": "bf16",
    "tim_examples": "7",
    "tim_depth": "deep",
    "tim_max_prompt_len": "40",
    "tim_max_new_tokens": "9",
    "tim_group_size": "2",
    "tim_shrink_seconds": "12.5",
    "tim_logprobs": "processed",
    "tim_engine_option": ["max_num_seqs=4", "seed=3"],
    "tim_engine_url": "http://localhost:8000",
    "tim_backend_micro_batch": "3",
    "tim_backend_attn": "eager",
    "tim_backend_option": ["world_size=1"],
    "tim_call_timeout": "30",
    "tim_start_timeout": "45",
}


def test_the_typed_values_are_the_options_converted() -> None:
    values = resolve(GIVEN)
    assert set(values) == {o.name for o in STACK_OPTIONS}
    assert values["engine-dtype"] == "bfloat16" and values["examples"] == 7
    assert values["shrink-seconds"] == 12.5 and values["logprobs"] is LogprobKind.PROCESSED
    assert values["depth"].name == "deep" and values["max-prompt-len"] == 40
    assert values["engine-option"] == {"max_num_seqs": "4", "seed": "3"}
    spec = StackSpec.from_options(GIVEN)
    assert spec.engine_options["url"] == "http://localhost:8000"
    assert (spec.depth.max_prompt_len, spec.depth.max_new_tokens) == (40, 9)


@pytest.mark.parametrize("given", [{}, GIVEN], ids=["defaults", "every option"])
def test_a_spec_is_rebuilt_from_its_values_and_from_its_flags(given: dict) -> None:
    built = StackSpec.from_options(given)
    values = built.option_values()
    # the profile a spec records is named in the rebuilt one, implied or not where it was built
    spec = replace(built, profile_named=True)
    assert StackSpec.from_options({}, values) == spec
    # a certificate's spec, and the stack_args an older one recorded instead
    assert StackSpec.from_options({}, certified_values({"spec": values})) == spec
    args = flags(values, prefix="")
    assert StackSpec.from_options({}, certified_values({"stack_args": args})) == spec


def test_a_certificate_before_both_names_its_stacks_fields() -> None:
    stack = {"engine": "vllm", "backend": "fsdp", "engine_dtype": "bfloat16", "logprobs": "raw"}
    values = certified_values({"stack": stack})
    assert values == {"engine": "vllm", "backend": "fsdp", "engine-dtype": "bfloat16",
                      "logprobs": "raw"}  # fmt: skip
