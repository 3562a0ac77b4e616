"""ringtrain's ``horovod`` shim: a small ``horovod`` package tree that forwards to ringtrain.

The folder holding this file (``SHIM_DIR``) contains a top-level ``horovod`` package. Put the folder
in front of ``PYTHONPATH`` (``ringtrain shim-path`` prints it; ``ringtrain run`` does it for workers;
``python -m ringtrain.shim script.py`` runs one script with it) and unmodified scripts that say
``import horovod.torch as hvd`` run on ringtrain. Real Horovod, when installed, always wins.
"""

from __future__ import annotations

from pathlib import Path

#: The directory to put on PYTHONPATH / sys.path so that ``import horovod`` finds the shim.
SHIM_DIR = Path(__file__).resolve().parent

__all__ = ["SHIM_DIR"]
