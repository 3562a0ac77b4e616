"""The ``horovod`` shim: ringtrain's small ``horovod`` package, put on the workers' PYTHONPATH.

Unmodified scripts say ``import horovod.torch as hvd``. When real Horovod is not importable in the
launcher's interpreter, the folder holding ringtrain's shim package goes in front of PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

import ringtrain

SHIM_DIR = Path(ringtrain.__file__).resolve().parent / "shim"


def horovod_importable() -> bool:
    """True when some ``horovod`` package other than our shim can be imported here."""
    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None and not spec.submodule_search_locations:
        return False
    locations = [Path(p).resolve() for p in (spec.submodule_search_locations or [])]
    return not any(SHIM_DIR in loc.parents for loc in locations)


def shim_pythonpath(environ: Mapping[str, str], enabled: bool = True) -> str | None:
    """The PYTHONPATH workers should get, or None to leave it alone."""
    if not enabled or not (SHIM_DIR / "horovod").is_dir() or horovod_importable():
        return None
    current = environ.get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p]
    if str(SHIM_DIR) in parts:
        return None
    return os.pathsep.join([str(SHIM_DIR), *parts])
