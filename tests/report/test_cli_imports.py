"""``gate`` and ``report`` start without torch, and every subcommand's ``--help`` but
``rl-smoke``'s (its defaults are the torch-backed RL run's): only the subcommand being run is
imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conformance.cli import SUBCOMMANDS, main

from .reports import make_report

HEAVY = ("torch", "transformers", "numpy")


def test_gate_and_report_run_without_importing_torch(tmp_path, cli_env) -> None:
    base, cand = tmp_path / "base.json", tmp_path / "cand.json"
    base.write_text(json.dumps(make_report(torch.float32).to_json()))
    cand.write_text(json.dumps(make_report(torch.float32).to_json()))
    code = f"""
import sys
from conformance.cli import main
codes = [main(["gate", {str(base)!r}, {str(cand)!r}]),
         main(["report", {str(base)!r}, "-o", {str(tmp_path / "r.html")!r}])]
print(codes, sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))
"""
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env, check=True
    )
    assert run.stdout.splitlines()[-1] == "[0, 0] []", run.stdout + run.stderr
    assert (tmp_path / "r.html").is_file()


@pytest.mark.parametrize("command", sorted(set(SUBCOMMANDS) - {"rl-smoke"}))
def test_a_subcommands_help_imports_no_torch(cli_env, command) -> None:
    code = f"""
import sys
from conformance.cli import main
try:
    main([{command!r}, "--help"])
except SystemExit as exc:
    print(exc.code, sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))
"""
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env, check=True
    )
    assert run.stdout.splitlines()[-1] == "0 []", run.stdout[-300:] + run.stderr


def test_report_modules_do_not_import_torch(cli_env) -> None:
    modules = (
        "conformance.report, conformance.gate, conformance.certificate, conformance.report.summary"
    )
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env, check=True
    )
    assert run.stdout.strip() == "False"


def test_help_and_a_mistyped_subcommand_list_every_subcommand(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SUBCOMMANDS)
    assert main(["gates"]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in SUBCOMMANDS), err
    assert len(err.strip().splitlines()) == 1 and "fix: see `tim-conformance --help`" in err, err


def test_an_unknown_option_is_one_line_naming_the_subcommands_help(capsys) -> None:
    assert main(["gate", "a.json", "b.json", "--no-such-flag"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "tim-conformance: error: unrecognized arguments: --no-such-flag "
        "(fix: see `tim-conformance gate --help`)"
    ], err
