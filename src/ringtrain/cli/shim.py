"""``ringtrain shim-path``: print the folder that holds ringtrain's ``horovod`` shim package.

Put it in front of ``PYTHONPATH`` and unmodified ``import horovod.torch as hvd`` scripts run on
ringtrain under any launcher::

    export PYTHONPATH="$(ringtrain shim-path):$PYTHONPATH"
    mpirun -np 4 python train.py

``ringtrain run`` does this for its workers by itself; ``--check`` tells whether a real Horovod would
take precedence here.

A plain ``python train.py`` of a Horovod script never reaches ringtrain, so nothing of ringtrain can
answer its ``No module named 'horovod'``. The one-process way, ``python -m ringtrain.shim train.py``,
is therefore said where a user who meets that error looks: here (on a terminal, on stderr, so that
``$(ringtrain shim-path)`` still captures the path alone), after ``install-aliases``, and in
docs/horovod-shim.md.
"""

from __future__ import annotations

import argparse
import sys
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


#: How a Horovod script runs without ``ringtrain run``: one process, or under any launcher.
PLAIN_PYTHON_NOTE = ("a plain `python train.py` of a Horovod script stops at `No module named 'horovod'`: "
                     "run it as one process with `python -m ringtrain.shim train.py [args]`, on several with "
                     "`ringtrain run -np N python train.py`, or under any launcher after "
                     '`export PYTHONPATH="$(ringtrain shim-path):$PYTHONPATH"`.')


def run(args: argparse.Namespace) -> int:
    """Print the shim directory (and, with --check, which horovod an import would find)."""
    print(SHIM_DIR, flush=True)
    if sys.stdout.isatty():  # read by a person, not captured by $(...)
        print(f"note: {PLAIN_PYTHON_NOTE}", file=sys.stderr)
    if args.check:
        if real_horovod_importable():
            print("note: a real `horovod` package is importable here; it takes precedence over the shim "
                  "only if it comes first on sys.path")
        else:
            print("no real `horovod` package is importable here: the shim will be used")
    return 0
