"""``ringtrain shim-path``: print the folder that holds ringtrain's ``horovod`` shim package.

Put it in front of ``PYTHONPATH`` and unmodified ``import horovod.torch as hvd`` scripts run on
ringtrain under any launcher::

    export PYTHONPATH="$(ringtrain shim-path):$PYTHONPATH"
    mpirun -np 4 python train.py

``ringtrain run`` does this for its workers by itself; ``--check`` tells whether a real Horovod would
take precedence here.
"""

from __future__ import annotations

import argparse
from typing import Any

from ringtrain.shim import SHIM_DIR, real_horovod_importable


def register(subparsers: Any) -> None:
    """Add the ``shim-path`` subcommand."""
    parser = subparsers.add_parser(
        "shim-path", help="print the directory to put on PYTHONPATH for `import horovod.torch`",
        description="Print the directory holding ringtrain's `horovod` shim package. Put it first on "
                    "PYTHONPATH so that unmodified Horovod scripts run on ringtrain: "
                    'export PYTHONPATH="$(ringtrain shim-path):$PYTHONPATH". '
                    "Or run one script with it: python -m ringtrain.shim train.py [args].")
    parser.add_argument("--check", action="store_true",
                        help="also report whether a real `horovod` package is importable here (it wins)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the shim directory (and, with --check, which horovod an import would find)."""
    print(SHIM_DIR)
    if args.check:
        if real_horovod_importable():
            print("note: a real `horovod` package is importable here; it takes precedence over the shim "
                  "only if it comes first on sys.path")
        else:
            print("no real `horovod` package is importable here: the shim will be used")
    return 0
