"""``tim-conformance contract``: run the engine contract on an engine, your own included."""

from __future__ import annotations

import argparse
from pathlib import Path

import conformance.contract
from conformance.engines import ENGINES
from conformance.options import parse_key_values

EPILOG = """exit status: 0 the engine meets the contract (capabilities it declares it lacks are
skipped with its reason), 1 a check failed (naming the method and what it must do), 2 usage error

examples:
  tim-conformance contract --engine mymod:MyEngine
  tim-conformance contract --engine vllm --engine-option enforce_eager=true -k generate
"""


HELP = "run the engine contract (protocol checks and precision controls) on an engine"
DESCRIPTION = (
    "Run the engine contract on one engine, a built-in or your own "
    "module:Class (importable from here: PYTHONPATH=. for a module in this folder): the "
    "protocol's shapes and alignment, seeds, load_weights, info, close, and precision "
    "controls against the transformers fp32 forward."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", required=True, metavar="E", help="engine or module:Class")
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        metavar="DIR",
        help="model folder (default: the embedded tiny model)",
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific setting, repeatable (default: the engine's own)",
    )
    parser.add_argument(
        "-k", default=None, metavar="EXPR", help="only checks matching EXPR (default: every check)"
    )


def run(args: argparse.Namespace) -> int:
    import pytest

    # an unknown engine or option is one line before any check starts
    ENGINES.get(args.engine).check_options(parse_key_values(args.engine_option))
    folder = Path(conformance.contract.__file__).parent
    pytest_args = [
        str(folder / "test_contract.py"),
        "--contract-engine",
        args.engine,
        *(["--contract-model", str(args.model)] if args.model else []),
        *(a for option in args.engine_option for a in ("--contract-engine-option", option)),
        *(["-k", args.k] if args.k else []),
        "-rs",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--rootdir={folder}",
    ]
    code = int(pytest.main(pytest_args))
    return code if code in (0, 1) else 2
