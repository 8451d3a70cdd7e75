"""Running ``tim-conformance`` as a user does, for the tests that judge its verdicts: a
subprocess from the repository root, its exit code, report.json and output."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINES = "tests.support.engines:"
#: examples a property when CI certifies a sound stack other than the default one: each property
#: still runs its example at the top sizes and four drawn ones. The default stack certifies at
#: the default 20 (tests/cli/test_certify.py), as do the suites against vLLM (tox's vllm env);
#: 20 for every variant too would take CI well past an hour on two cores.
VARIANT_EXAMPLES = ("--examples", "5")


def tim_conformance(
    *args: str, env: dict[str, str], cwd: Path = REPO, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``tim-conformance ARGS`` run from ``cwd``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "conformance", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
    )  # fmt: skip


def certify(*args: str, env: dict[str, str], out: Path) -> tuple[int, dict, str]:
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=1800,
    )
    report = json.loads((out / "report.json").read_text())
    return result.returncode, report, result.stdout + result.stderr


def certify_interrupted(
    *args: str, env: dict[str, str], out: Path, at: str, signal_name: str
) -> tuple[int, str]:
    """Run certify, send it ``signal_name`` once a line of its output holds ``at``, and return
    its exit code and output."""
    process = subprocess.Popen(
        [sys.executable, "-m", "conformance", "certify", "--out", str(out), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
        preexec_fn=_interruptible,
    )  # fmt: skip
    said = []
    for line in process.stdout:
        said.append(line)
        if at in line:
            process.send_signal(getattr(signal, signal_name))
            break
    said.extend(process.stdout)
    return process.wait(timeout=600), "".join(said)


def _interruptible() -> None:
    """Ctrl-C as a terminal delivers it: a run started from a shell's background job inherits
    SIGINT ignored, and Python then keeps it ignored (no KeyboardInterrupt to test)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def failed_checks(report: dict) -> list[dict]:
    return [c for c in report["checks"] if c["status"] == "fail"]
