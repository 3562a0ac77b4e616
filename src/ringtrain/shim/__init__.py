"""ringtrain's ``horovod`` shim: a small ``horovod`` package tree that forwards to ringtrain.

The folder holding this file (``SHIM_DIR``) contains a top-level ``horovod`` package. Put the folder
in front of ``PYTHONPATH`` (``ringtrain shim-path`` prints it; ``ringtrain run`` does it for workers;
``python -m ringtrain.shim script.py`` runs one script with it) and unmodified scripts that say
``import horovod.torch as hvd`` run on ringtrain. Real Horovod, when installed, always wins.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

#: The directory to put on PYTHONPATH / sys.path so that ``import horovod`` finds the shim.
SHIM_DIR = Path(__file__).resolve().parent

__all__ = ["SHIM_DIR", "real_horovod_importable", "shim_pythonpath"]


def real_horovod_importable() -> bool:
    """True when some ``horovod`` package other than this shim can be imported here (it then wins)."""
    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None and not spec.submodule_search_locations:
        return False
    locations = [Path(p).resolve() for p in (spec.submodule_search_locations or [])]
    return not any(SHIM_DIR in loc.parents for loc in locations)


def shim_pythonpath(environ: Mapping[str, str], enabled: bool = True) -> str | None:
    """``environ``'s PYTHONPATH with the shim in front, or None to leave it alone.

    None when the shim is not wanted, when real Horovod is importable, or when the shim is there already.
    """
    if not enabled or real_horovod_importable():
        return None
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(SHIM_DIR) in parts:
        return None
    return os.pathsep.join([str(SHIM_DIR), *parts])
