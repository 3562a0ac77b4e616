"""Entry point of the ``ringtrain`` console script.

Each subcommand lives in its own module under ``ringtrain.cli`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ringtrain import __version__
from ringtrain.cli.usage import HelpfulParser
from ringtrain.exceptions import UsageError

#: Subcommand modules, in the order ``ringtrain --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "run",
    "check",
    "train",
    "env",
    "script",
    "shim",
    "bench",
    "aliases",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every registered subcommand."""
    parser = HelpfulParser(
        prog="ringtrain",
        description="Data-parallel training for PyTorch, from one CPU core to many GPU nodes.",
    )
    parser.add_argument("--version", action="version", version=f"ringtrain {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=HelpfulParser)
    for name in COMMANDS:
        importlib.import_module(f"ringtrain.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"ringtrain {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
