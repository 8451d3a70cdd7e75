"""``tim-conformance check`` on the real engines a launcher runs: a certificate of a vLLM stack
lets a launch of that very stack go, its output the verdict alone; and two starts of a stack,
each in its own process as a certify and a later check are, fingerprint alike. What an engine
sets afresh at every start (vLLM's distributed-init and shared-memory names, SGLang's run id) names
that start, not the stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.certify_runs import tim_conformance

from conformance.certificate import compare_stacks

REPO = Path(__file__).resolve().parents[2]

#: the stack of ``--engine ENGINE`` (and ``--engine-option KEY=VALUE`` for each further
#: argument) as ``check`` starts it, as a certificate records it
_STARTED = """
import json, sys
from conformance.certificate import stable_stack
from conformance.stack import StackSpec
from conformance.started_stack import StartedStack
if __name__ == "__main__":  # SGLang spawns its scheduler
    options = dict(pair.split("=", 1) for pair in sys.argv[3:])
    stack = StartedStack.fingerprint_of(StackSpec(engine=sys.argv[1], engine_options=options))
    with open(sys.argv[2], "w") as file:
        json.dump(stable_stack(stack), file)
"""


@pytest.mark.parametrize(
    ("engine", "defaults"),
    [
        pytest.param("vllm", ["enable_prefix_caching=true"], marks=pytest.mark.vllm),
        pytest.param(
            "sglang", ["disable_radix_cache=false", "tp_size=1"], marks=pytest.mark.sglang
        ),
    ],
)
def test_two_starts_of_a_stack_fingerprint_alike(engine, defaults, cli_env, tmp_path):
    """The second start as a launch that spells out some of the engine's own defaults: the
    same stack, whatever the launch names of it."""

    def started(path: Path, *options: str) -> dict:
        result = subprocess.run(
            [sys.executable, "-c", _STARTED, engine, str(path), *options],
            capture_output=True, text=True, env=cli_env, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(path.read_text())

    certified = started(tmp_path / "first.json")
    launched = started(tmp_path / "second.json", *defaults)
    assert compare_stacks({"stack": certified}, launched).differences == []


def certify(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return tim_conformance("certify", *args, env=env, timeout=1800)


@pytest.mark.vllm
def test_a_certified_vllm_stack_lets_its_launch_go(cli_env, tmp_path):
    # unsigned, checked without a key: no signature note joins the verdict
    env = {k: v for k, v in cli_env.items() if k != "TIM_CERT_KEY"}
    out = tmp_path / "run"
    run = certify("--engine", "vllm", "--examples", "1", "--out", str(out), env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = tim_conformance("check", str(out / "certificate.json"), env=env)
    assert check.returncode == 0, check.stdout + check.stderr[-3000:]
    # vLLM's start-up log goes to the error output: a launcher reads the verdict alone
    assert check.stdout.splitlines() == [
        "tim-conformance: CERTIFIED for this launch: the current stack is the one certified in "
        f"{out / 'certificate.json'}"
    ]
