"""The engine contract as a user runs it: ``tim-conformance contract --engine mod:Class`` on an
engine module outside the project. An engine that declares bf16 unsupported passes with that
check skipped for the engine's reason; one whose ``generate`` misbehaves fails naming the method
and what it must do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: the user's module, written outside the project
MODULE = '''
from conformance.engines import Unsupported
from conformance.engines.hf_generate import HFGenerateEngine


class NoBf16(HFGenerateEngine):
    name = "no-bf16"

    def __init__(self, config):
        if config.dtype == "bfloat16":
            raise Unsupported("no-bf16 has no bfloat16 kernels", "run it in float32")
        super().__init__(config)


class Reversed(HFGenerateEngine):
    """Answers a batch in reverse order."""

    name = "reversed"

    def generate(self, prompts, spec, **kw):
        return super().generate(prompts, spec, **kw)[::-1]
'''


def contract(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-m", "conformance", "contract", *args],
        capture_output=True, text=True, env={**env, "PYTHONPATH": path}, cwd=folder, timeout=900,
    )  # fmt: skip


def test_an_engine_outside_the_project_refusing_bf16_passes_with_it_skipped(tmp_path, cli_env):
    (tmp_path / "my_engine.py").write_text(MODULE)
    result = contract(tmp_path, "--engine", "my_engine:NoBf16", env=cli_env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert " passed" in output and " failed" not in output, output[-3000:]
    assert "engine 'my_engine:NoBf16' declares: no-bf16 has no bfloat16 kernels" in output


def test_a_misbehaving_method_fails_naming_it_and_the_expectation(tmp_path, cli_env):
    (tmp_path / "my_engine.py").write_text(MODULE)
    result = contract(tmp_path, "--engine", "my_engine:Reversed", "-k", "aligned", env=cli_env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "generate() must return one completion per prompt, in order" in output


def test_an_unknown_engine_is_one_line(tmp_path, cli_env):
    result = contract(tmp_path, "--engine", "no_such_module:Engine", env=cli_env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "no_such_module" in line and "fix:" in line
