"""Two starts of the same stack, each in its own process as a certify and a later
``certify --check`` are, fingerprint alike: what an engine sets afresh at every start (vLLM's
distributed-init and shared-memory names, SGLang's run id) names that start, not the stack, so a
certificate of a vLLM or SGLang stack lets a launch of that very stack go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.certificate import compare_stacks

#: the stack of ``--engine ENGINE`` as ``certify --check`` starts it, as a certificate records it
_STARTED = """
import json, sys
from conformance.certificate import stable_stack
from conformance.stack import StackSpec
from conformance.started_stack import StartedStack
if __name__ == "__main__":  # SGLang spawns its scheduler
    stack = StartedStack.fingerprint_of(StackSpec(engine=sys.argv[1]))
    with open(sys.argv[2], "w") as file:
        json.dump(stable_stack(stack), file)
"""


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param("vllm", marks=pytest.mark.vllm),
        pytest.param("sglang", marks=pytest.mark.sglang),
    ],
)
def test_two_starts_of_a_stack_fingerprint_alike(engine, cli_env, tmp_path):
    def started(path: Path) -> dict:
        result = subprocess.run(
            [sys.executable, "-c", _STARTED, engine, str(path)],
            capture_output=True, text=True, env=cli_env, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(path.read_text())

    certified, launched = started(tmp_path / "first.json"), started(tmp_path / "second.json")
    assert compare_stacks({"stack": certified}, launched).differences == []
