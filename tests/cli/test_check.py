"""``tim-conformance check CERT`` as a launcher's gate, run as a launcher runs it (a
subprocess, real runs of the default stack): exit 0 only on an untouched certificate of a
CERTIFIED run of today's stack; exit 1, one line per reason, on a NOT CERTIFIED, a ``--suite``
or an interrupted run's certificate, an edited field (named), a signature that does not verify,
a stack that changed; exit 2 on a file that is no certificate. ``certify --check CERT``, its
deprecated spelling, still gives the same verdicts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support.certify_runs import certify_interrupted, tim_conformance

REPO = Path(__file__).resolve().parents[2]
KEY = "launcher-secret"
REFUSED = "tim-conformance: NOT CERTIFIED for this launch: "


def certify(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return tim_conformance("certify", *args, env=env, cwd=cwd)


def check(
    certificate: Path, env: dict[str, str], *flags: str, **variables: str
) -> tuple[int, list[str]]:
    """``check``'s exit code and its verdict lines (those it prints on stdout), the launch
    naming ``flags``."""
    result = tim_conformance("check", str(certificate), *flags, env={**env, **variables})
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout.splitlines()


def reasons(lines: list[str]) -> list[str]:
    return [line.removeprefix(REFUSED) for line in lines if line.startswith(REFUSED)]


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    """The environment every certify and check of the module runs in: the same, so that the
    stack it records is the same, and without a key unless a test gives one."""
    variables = {**os.environ, "HF_HUB_OFFLINE": "1"}
    variables.pop("TIM_CERT_KEY", None)
    return variables


@pytest.fixture(scope="module")
def certified(env, tmp_path_factory) -> Path:
    """A CERTIFIED run of the default stack (every suite, two examples a property), its
    certificate signed with ``KEY``; the folder holds report.json beside it."""
    out = tmp_path_factory.mktemp("certified") / "run"
    run = certify("--examples", "2", "--out", str(out), env={**env, "TIM_CERT_KEY": KEY})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    certificate = json.loads((out / "certificate.json").read_text())
    assert certificate["certified"] is True and certificate["signature"].startswith("hmac-")
    return out


def edited(certified: Path, folder: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of the certified run's folder whose certificate ``edit`` changed."""
    shutil.copytree(certified, folder)
    path = folder / "certificate.json"
    certificate = json.loads(path.read_text())
    edit(certificate)
    path.write_text(json.dumps(certificate, indent=2))
    return path


def test_an_untouched_certificate_of_a_certified_run_lets_the_launch_go(certified, env):
    code, lines = check(certified / "certificate.json", env)
    assert code == 0, lines
    assert lines[0].startswith("tim-conformance: CERTIFIED for this launch: the current stack")
    # signed, but no key to verify it with: said, not passed over in silence
    assert "tim-conformance: signature not verified (TIM_CERT_KEY not set)" in lines
    code, lines = check(certified / "certificate.json", env, TIM_CERT_KEY=KEY)
    assert code == 0, lines
    assert "tim-conformance: signature verified with TIM_CERT_KEY" in lines


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("fingerprint", lambda c: c.update(fingerprint="0" * 16)),
        (
            "metrics.rollout_parity.abs_diff_max",
            lambda c: c["metrics"]["rollout_parity"].update(abs_diff_max=1e-9),
        ),
        ("verdict", lambda c: c.update(verdict="fail")),
        # the options check rebuilds the stack from: held to the report's too
        ("spec.examples", lambda c: c["spec"].update(examples="1")),
    ],
)
def test_an_edited_field_is_named_and_breaks_the_signature(field, edit, certified, env, tmp_path):
    path = edited(certified, tmp_path / "run", edit)
    code, lines = check(path, env, TIM_CERT_KEY=KEY)
    assert code == 1, lines
    said = reasons(lines)
    assert lines[0].startswith(REFUSED)
    assert any(r.startswith(f"certificate field '{field}' was edited: it says ") for r in said)
    assert any(r.startswith("certificate field 'signature' does not verify") for r in said)
    # the stack itself is today's: no stack difference is blamed for it
    assert not any(r.startswith("the stack changed") for r in said), said


@pytest.mark.parametrize(
    ("field", "value"), [("model", "/nonexistent/model"), ("engine", "no-such-engine")]
)
def test_an_edited_stack_option_is_refused_before_the_stack_is_built(
    field, value, certified, env, tmp_path
):
    """The values of an edited certificate name no stack to build: the edit is the verdict
    (exit 1), not a usage error over a model folder or engine that its run never had."""
    path = edited(certified, tmp_path / "run", lambda c: c["spec"].update({field: value}))
    code, lines = check(path, env)
    assert code == 1, lines
    (reason,) = reasons(lines)
    assert reason.startswith(f"certificate field 'spec.{field}' was edited: it says {value!r}")


def test_an_edited_fingerprint_shows_without_the_report_or_a_key(certified, env, tmp_path):
    """Moved away from its report, with no key set: the fingerprint is recomputed from the
    stack the certificate records."""
    path = edited(certified, tmp_path / "run", lambda c: c.update(fingerprint="0" * 16))
    (path.parent / "report.json").unlink()
    code, lines = check(path, env)
    assert code == 1, lines
    (reason,) = reasons(lines)
    assert reason.startswith("certificate field 'fingerprint' was edited (or its 'stack'): ")
    assert "tim-conformance: signature not verified (TIM_CERT_KEY not set)" in lines


def test_certify_check_is_the_deprecated_spelling_of_check(certified, env):
    """``certify --check CERT``, as launchers spelled the gate before ``check``: the same
    verdicts, the run's own options ignored as they were, and a warning naming the new
    spelling."""
    certificate = str(certified / "certificate.json")
    passed = certify("--check", certificate, "--out", "never-written", env=env)
    refused = certify("--check", certificate, "--examples", "500", env=env)
    assert (passed.returncode, refused.returncode) == (0, 1), passed.stderr + refused.stderr
    assert passed.stdout.startswith("tim-conformance: CERTIFIED for this launch")
    assert reasons(refused.stdout.splitlines()) == [
        "the launch's values differ from the certified ones: spec.examples"
    ]
    warning = "`certify --check CERTIFICATE` is deprecated: use `tim-conformance check"
    assert all(warning in result.stderr for result in (passed, refused))
    assert not (REPO / "never-written").exists()


@pytest.mark.parametrize("flag", [["--out", "run"], ["--suite", "rollout_parity"], ["--rl-smoke"]])
def test_a_run_option_is_refused_by_check_in_one_line(flag, env, tmp_path):
    """What only a certify run reads starts nothing a launch could be held to: ``check`` refuses
    it, before it reads the certificate, rather than let a launcher believe it was checked."""
    result = tim_conformance("check", str(tmp_path / "certificate.json"), *flag, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    (error,) = result.stderr.splitlines()
    assert error.startswith(f"tim-conformance: error: unrecognized arguments: {flag[0]}")
    assert error.endswith("(fix: see `tim-conformance check --help`)")


def test_another_key_does_not_verify_the_signature(certified, env):
    code, lines = check(certified / "certificate.json", env, TIM_CERT_KEY="another")
    assert code == 1, lines
    assert reasons(lines) == [
        "certificate field 'signature' does not verify with TIM_CERT_KEY: the certificate was "
        "edited after it was signed, or signed with another key"
    ]


def test_a_not_certified_run_certifies_no_launch(env, tmp_path):
    """A full run that ends NOT CERTIFIED (the shipped fp32 profile with a bound no stack
    meets): its certificate is untouched and names today's stack, and still refused."""
    profile = tmp_path / "tiny.toml"
    shipped = (REPO / "conformance" / "profiles" / "fp32.toml").read_text().splitlines()
    profile.write_text(
        "\n".join("abs_diff_max = 1e-12" if s.startswith("abs_diff_max =") else s for s in shipped)
    )
    out = tmp_path / "run"
    run = certify("--profile", str(profile), "--examples", "1", "--out", str(out), env=env)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    code, lines = check(out / "certificate.json", env)
    assert code == 1, lines
    assert reasons(lines) == ["its run was not certified: verdict NOT CERTIFIED"]


def test_a_suite_run_certifies_no_launch_and_a_key_wants_a_signature(env, tmp_path):
    out = tmp_path / "run"
    run = certify(
        "--suite", "rollout_parity", "--examples", "2", "--out", str(out), env=env
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    code, lines = check(out / "certificate.json", env, TIM_CERT_KEY=KEY)
    assert code == 1, lines
    # written with no key: unsigned, which a launcher holding the key refuses
    assert reasons(lines) == [
        "scoped to suite(s) rollout_parity: a --suite run is no certificate of the stack "
        "(certify without --suite)",
        "the certificate is not signed, and TIM_CERT_KEY is set: only a certificate certify "
        "signed with that key is accepted",
    ]


def test_an_interrupted_run_certifies_no_launch(env, tmp_path):
    out = tmp_path / "run"
    code, output = certify_interrupted(
        env=env, out=out, at="tim-conformance: certifying", signal_name="SIGTERM"
    )
    assert code == 2, output[-3000:]
    code, lines = check(out / "certificate.json", env)
    assert code == 1, lines
    # cut short before its engine started, it recorded no engine or backend info either: refused
    # for what it certified, its stack is not started to show that difference
    assert reasons(lines) == [
        "its run was not certified: it did not finish (verdict incomplete: interrupted, or a "
        "component failed)"
    ]


def test_thread_settings_outside_the_flags_are_part_of_the_stack(certified, env):
    recorded = json.loads((certified / "certificate.json").read_text())["stack"]["device"]
    threads = "2" if recorded["threads"] == 1 else "1"
    code, lines = check(certified / "certificate.json", env, OMP_NUM_THREADS=threads)
    assert code == 1, lines
    (reason,) = reasons(lines)
    assert reason.startswith("the stack changed since it was certified: ")
    changed = reason.split(": ", 1)[1].split(", ")
    assert {"env.OMP_NUM_THREADS", "device.threads"} <= set(changed)
    assert f"  device.threads: certified {recorded['threads']}, now {threads}" in lines


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        # an RL run's own rollout length and group size, beyond what the certified run drew
        (
            ["--max-new-tokens", "1000", "--group-size", "16"],
            ["run_shape.max_new_tokens", "run_shape.group_size"],
        ),
        # a looser profile than the one the run was judged by, more examples than it drew
        (["--profile", "bf16", "--examples", "500"], ["spec.examples", "profile"]),
    ],
)
def test_a_launch_at_values_it_was_not_certified_at_is_refused(flags, fields, certified, env):
    """The launch names the values its run is judged at: a certificate covers the ones it was
    certified at, no others (exit 1, each named; the stack itself is the certified one)."""
    code, lines = check(certified / "certificate.json", env, *flags)
    assert code == 1, lines
    (reason,) = reasons(lines)
    assert reason == f"the launch's values differ from the certified ones: {', '.join(fields)}"


def test_a_launch_at_the_values_it_was_certified_at_goes(certified, env, tmp_path):
    """Named as a launcher names them, the values the run was certified at: its profile as a
    file of its own holding the same bounds, its limits by number."""
    shape = json.loads((certified / "certificate.json").read_text())["run_shape"]
    ours = tmp_path / "ours.toml"
    shutil.copy(REPO / "conformance" / "profiles" / "fp32.toml", ours)
    code, lines = check(
        certified / "certificate.json", env,
        "--profile", str(ours), "--examples", "2", "--depth", "quick",
        "--max-new-tokens", str(shape["max_new_tokens"]),
        "--max-prompt-len", str(shape["max_prompt_len"]),
    )  # fmt: skip
    assert code == 0, lines


def test_a_certificate_checks_where_the_launch_runs(env, tmp_path):
    """Certified from the model's parent folder (``--model model``), on a model no shipped
    profile was measured on, so judged by its own, calibrated into the certifying machine's
    cache: a launch from another folder, on a machine without that cache, checks the
    certificate all the same, calibrating nothing (the profile judges a run, not a launch)."""
    from conformance.models import make_model

    make_model(tmp_path / "model", seed=7)
    out = tmp_path / "run"
    certifying = {**env, "TIM_CONFORMANCE_CACHE": str(tmp_path / "certifier")}
    run = certify(
        "--model", "model", "--examples", "1", "--out", str(out), env=certifying, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["profile"]["name"].startswith("own-")
    # the launch machine has none of the certifying one's cache
    shutil.rmtree(tmp_path / "certifier")
    launching = {**env, "TIM_CONFORMANCE_CACHE": str(tmp_path / "launcher")}
    result = tim_conformance("check", str(out / "certificate.json"), env=launching)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "calibrating" not in result.stdout + result.stderr
    assert not (tmp_path / "launcher" / "profiles").exists()


@pytest.mark.parametrize("content", [None, "{not json", '{"certificate_schema": 1}'])
def test_a_file_that_is_no_certificate_is_one_line_and_exit_2(content, env, tmp_path):
    path = tmp_path / "certificate.json"
    if content is not None:
        path.write_text(content)
    result = tim_conformance("check", str(path), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [e for e in result.stderr.splitlines() if e.startswith("tim-conformance: error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "(fix: pass " in errors[0] and not reasons(result.stdout.splitlines())
