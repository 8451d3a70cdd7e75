"""``tim-conformance`` command line: one module per subcommand, dispatched from here.

Each subcommand module declares what its parser says (``HELP``, ``DESCRIPTION``, ``EPILOG``: its
examples), ``add_arguments(parser)`` and ``run(args) -> int``; the parser itself is made here,
the same way for each. Known errors become one line and exit code 2.

Only the module of the subcommand being run is imported, so ``gate`` and ``report`` start
without torch; ``--help`` and a mistyped subcommand import them all, to list them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from conformance import __version__
from conformance.errors import ConformanceError, UsageError

#: subcommands, in the order ``--help`` lists them; ``make-model`` lives in
#: ``conformance.cli.make_model``
SUBCOMMANDS = (
    "certify",
    "check",
    "calibrate",
    "contract",
    "make-model",
    "floor",
    "report",
    "gate",
    "rl-smoke",
)

EPILOG = """examples:
  tim-conformance certify                                   # hf-generate vs hf, embedded model
  tim-conformance certify --engine-dtype bfloat16 --profile fp32
  tim-conformance check reports/<timestamp>/certificate.json  # a launcher's gate
  tim-conformance calibrate --model DIR --engine-dtype bf16 --out mine.toml  # your model's profile
  tim-conformance contract --engine mymod:MyEngine          # the engine contract on yours
  tim-conformance make-model /tmp/tiny --arch qwen3 --seed 1
  tim-conformance floor --dtype bf16 --vocab 2048 --logit-std 1.5 --tokens 50000 --seed 1234
"""


class CliParser(argparse.ArgumentParser):
    """argparse's own usage errors (an unknown option, a mistyped subcommand) raised as the
    CLI's other errors are: a :class:`UsageError`, one line that names the fix, not a usage
    block."""

    def __init__(self, *args: Any, help_command: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # an unknown option is reported by the top-level parser: its fix is the subcommand's help
        self.help_command = help_command or self.prog

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, f"see `{self.help_command} --help`")


def make_parser(command: str | None = None) -> CliParser:
    """The parser; with ``command`` (one of ``SUBCOMMANDS``) only that subcommand's."""
    parser = CliParser(
        prog="tim-conformance",
        help_command=f"tim-conformance {command}" if command else None,
        description="Numerical conformance harness for training–inference mismatch in LLM RL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS if command is None else (command,):
        module = importlib.import_module(f"conformance.cli.{name.replace('-', '_')}")
        sub = subparsers.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            epilog=module.EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the only top-level options, --help and --version, exit: a subcommand can only come first
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        args = make_parser(command).parse_args(argv)
        return args.func(args)
    except ConformanceError as exc:
        print(f"tim-conformance: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tim-conformance: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
