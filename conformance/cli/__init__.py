"""``tim-conformance`` command line: one module per subcommand, dispatched from here.

Each subcommand module defines ``add_parser(subparsers)`` (which registers its parser and sets
``func``) and a ``run(args) -> int``. Known errors become one line and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from conformance import __version__
from conformance.errors import ConformanceError

#: subcommand modules, in the order ``--help`` lists them
SUBCOMMANDS = (
    "conformance.cli.certify",
    "conformance.cli.make_model",
    "conformance.cli.floor",
    "conformance.cli.report",
    "conformance.cli.gate",
    "conformance.cli.rl_smoke",
)

EPILOG = """examples:
  tim-conformance certify                                   # hf-generate vs hf, embedded model
  tim-conformance certify --engine-dtype bfloat16 --profile fp32
  tim-conformance make-model /tmp/tiny --arch qwen3 --seed 1
  tim-conformance floor --dtype bf16 --vocab 2048 --logit-std 1.5 --tokens 50000 --seed 1234
"""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tim-conformance",
        description="Numerical conformance harness for training–inference mismatch in LLM RL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConformanceError as exc:
        print(f"tim-conformance: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tim-conformance: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
