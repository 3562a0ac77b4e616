"""``ringtrain install-aliases``: the one step after which ``horovodrun ...`` lines run on ringtrain.

Why it is a step and not part of ``pip install``: see :mod:`ringtrain.launch.aliases`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ringtrain.cli.shim import PLAIN_PYTHON_NOTE
from ringtrain.launch import aliases


def register(subparsers: Any) -> None:
    """Add the ``install-aliases`` subcommand."""
    names = ", ".join(aliases.ALIASES)
    parser = subparsers.add_parser(
        "install-aliases", help=f"install {names} as a name of `ringtrain run` (tutorial lines run verbatim)",
        description=f"Write {names} into this environment's script folder (or --dir): a small script that "
                    "runs `ringtrain run` with the same arguments, so that tutorial lines such as "
                    "`horovodrun -np 4 -H host1:2,host2:2 python train.py` run as they are. Refused where "
                    "a real Horovod is installed or another file of that name exists; --remove deletes "
                    "only ringtrain's own aliases.")
    parser.add_argument("--dir", type=Path, default=None, metavar="DIR",
                        help=f"folder to write into (default: {aliases.default_directory()})")
    parser.add_argument("--remove", action="store_true", help="delete ringtrain's aliases from the folder")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Install (or remove) the aliases and say what happened to each."""
    results = aliases.remove(args.dir) if args.remove else aliases.install(args.dir)
    for result in results:
        line = f"{result.name}: {result.action} {result.path}"
        print(line + (f" ({result.note})" if result.note else ""))
    if not args.remove:
        # the alias covers `horovodrun ...` lines; a tutorial's bare `python train.py` is the other half
        print(f"note: {PLAIN_PYTHON_NOTE}")
    return 0
