"""``python -m ringtrain.shim script.py [args...]``: run a Horovod script with the shim in front.

When a real ``horovod`` package is importable it is used unchanged; otherwise the shim directory is
put first on ``sys.path`` (and on ``PYTHONPATH``, for processes the script starts). ``-m module``
runs a module instead of a script file.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from ringtrain.shim import SHIM_DIR, real_horovod_importable, shim_pythonpath

USAGE = "usage: python -m ringtrain.shim (script.py | -m module) [args...]"


def enable() -> bool:
    """Put the shim first on ``sys.path`` and ``PYTHONPATH`` unless real Horovod is importable.

    Returns True when the shim was enabled.
    """
    if real_horovod_importable():
        return False
    shim = str(SHIM_DIR)
    if shim not in sys.path:
        sys.path.insert(0, shim)
    pythonpath = shim_pythonpath(os.environ)
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script or module named in ``argv`` with the shim enabled."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if argv else 2
    enable()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(f"error: -m needs a module name. {USAGE}", file=sys.stderr)
            return 2
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"error: script {script!r} does not exist. HINT: give the path of a Python file, "
              f"e.g. python -m ringtrain.shim train.py --epochs 1", file=sys.stderr)
        return 2
    sys.argv = [script, *argv[1:]]
    sys.path.insert(1, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
