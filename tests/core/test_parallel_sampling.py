"""n samples per prompt (``SamplingSpec.n``): the guard holds an answer to ``len(prompts) · n``
completions, and an engine that does not declare its own parallel-sampling path gets its groups
as one batch per child at n = 1, child c seeded seed + c."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conformance.engines import Completion, EngineConfig, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.errors import UsageError
from conformance.guard import ProtocolViolation, check_answer
from conformance.suite_support import sample_groups


def test_n_below_one_is_one_line_naming_the_fix():
    with pytest.raises(UsageError, match="n >= 1"):
        SamplingSpec(n=0)


def test_the_guard_wants_n_completions_per_prompt():
    spec = SamplingSpec(max_new_tokens=1, n=2)
    one = Completion(prompt=[5], tokens=[7], logprobs=[-1.0])
    check_answer("engine 'e'", "generate", ([[5]], spec), [one, one])
    with pytest.raises(ProtocolViolation, match="1 completions for 1 prompts x n=2"):
        check_answer("engine 'e'", "generate", ([[5]], spec), [one])


class _RepeatedPrompts(HFGenerateEngine):
    """hf-generate declaring no parallel-sampling path (an engine written before n)."""

    name = "repeated-prompts"
    capabilities = replace(HFGenerateEngine.capabilities, parallel_sampling=False)

    def generate(self, prompts, spec, **kw):
        assert spec.n == 1, "an engine not declaring parallel_sampling is given n = 1"
        return super().generate(prompts, spec, **kw)


class _Remarks:
    def __init__(self) -> None:
        self.said: list[str] = []

    def remark(self, text: str) -> None:
        self.said.append(text)


@pytest.mark.parametrize("engine_class", [HFGenerateEngine, _RepeatedPrompts])
def test_groups_come_prompt_major_on_either_path(engine_class, default_model: Path):
    engine = engine_class(EngineConfig(model=default_model))
    prompts, n = [[5, 6, 7], [9, 10]], 3
    remarks = _Remarks()

    children = sample_groups(engine, prompts, SamplingSpec(max_new_tokens=6, seed=3, n=n), remarks)

    assert [c.prompt for c in children] == [p for p in prompts for _ in range(n)]
    # six 6-token draws of a random model at temperature 1: a repeat about once in 1e10
    assert len({tuple(c.tokens) for c in children}) == len(children)
    assert bool(remarks.said) == (not engine_class.capabilities.parallel_sampling)
