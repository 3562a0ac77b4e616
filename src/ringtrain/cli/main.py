"""Entry point of the ``ringtrain`` console script.

Each subcommand lives in its own module under ``ringtrain.cli`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

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
    """Run the command line; returns the process exit code.

    As the process's own entry (the console script, ``python -m ringtrain``: no ``argv``), a command that
    imported torch ends the process here once its output is out: tearing torch's modules down at the
    interpreter's exit took 1-1.5 s on a loaded 2-core machine, after the launcher's last word (a
    failure report must be followed by the launcher's end within 2 s, issue 27).
    """
    code = _run(argv)
    if argv is None and "torch" in sys.modules:
        exit_now(code)
    return code


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` as a normal exit would, minus the modules' teardown: every
    non-daemon thread is joined, the ``atexit`` callbacks run (logging's flush among them), and the
    standard streams are flushed."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _run(argv: Sequence[str] | None) -> int:
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
