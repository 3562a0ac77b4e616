"""glibc malloc settings for training processes: keep freed tensor memory for the next step.

A training step frees and allocates the same activations and gradients every step. With glibc's
defaults, blocks above the mmap threshold (128 KiB, rising with use) are mapped and unmapped one by
one, and the top of the heap goes back to the kernel whenever more than the trim threshold lies free
there. Either way the next step writes to fresh pages, and the kernel faults in and zeroes every one
of them. Measured on the 2-core VM (ResNet-18, batch 32, one thread, alternating runs): 31,000 to
46,000 minor page faults per step with the defaults, 7,000 to 9,000 with these settings, and steps
4 to 10 % faster. Ranks on one host fault at the same time and share the memory bus doing it.

``RINGTRAIN_MALLOC=tuned`` (the default) sets three of malloc's parameters with ``mallopt`` when a
process starts training (``hvd.init()``, and the Trainer for every strategy, the single-process
baseline of ``ringtrain bench`` included, so its efficiencies compare like with like):

- ``M_MMAP_THRESHOLD`` 32 MiB (glibc's largest on 64-bit): smaller blocks come from the heap, which
  keeps them after ``free``; larger ones are still mapped each time;
- ``M_TRIM_THRESHOLD`` 1 GiB: up to that much free memory stays at the heap's top;
- ``M_TOP_PAD`` 64 MiB: the heap grows in larger steps (fewer ``brk`` calls).

The memory a process keeps is what its own steps allocate anyway (their peak), so its resident size
stays near that peak between steps instead of dipping. ``system`` leaves glibc's defaults. Nothing is
changed where malloc is not glibc's, where ``LD_PRELOAD`` brings another allocator (jemalloc,
tcmalloc, mimalloc), or where the environment sets malloc's own variables (``MALLOC_*_`` or
``glibc.malloc`` tunables): the user's choice stands.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Mapping

log = logging.getLogger("ringtrain")

MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 64 * 1024 * 1024
# mallopt's parameter numbers, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
#: Variables through which a user sets glibc malloc's parameters at start-up.
_USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

#: What :func:`tune_allocator` did in this process ("tuned", "system" or "system (why)"); None before.
_state: str | None = None


def tune_allocator(setting: str, environ: Mapping[str, str] | None = None) -> str:
    """Apply ``RINGTRAIN_MALLOC`` (``tuned`` or ``system``) to this process once; returns what holds.

    The answer is ``"tuned"``, ``"system"``, or ``"system (<why not tuned>)"``. Later calls return
    the first answer: the parameters are set once per process.
    """
    global _state
    if _state is not None:
        return _state
    if setting != "tuned":
        _state = "system"
        return _state
    why = _why_not(os.environ if environ is None else environ) or _apply()
    if why is None:
        _state = "tuned"
    else:
        _state = f"system ({why})"
        log.debug("malloc keeps glibc's defaults: %s", why)
    return _state


def allocator_state() -> str:
    """What this process's malloc runs with ("not set up" before :func:`tune_allocator`)."""
    return _state or "not set up"


def _why_not(environ: Mapping[str, str]) -> str | None:
    """Why the parameters must stay as they are, or None."""
    libc, _ = platform.libc_ver()
    if libc != "glibc":
        return f"the C library is {libc or 'not glibc'}"
    preload = environ.get("LD_PRELOAD", "")
    other = next((name for name in _OTHER_ALLOCATORS if name in preload), None)
    if other:
        return f"LD_PRELOAD brings {other}"
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(environ.get(name) for name in _USER_VARIABLES) or "glibc.malloc." in tunables:
        return "the environment sets malloc's parameters"
    return None


def _apply() -> str | None:
    """Set the three parameters; None, or why it failed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError) as exc:
        return f"mallopt is not available: {exc}"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for parameter, value in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                             (_M_TOP_PAD, TOP_PAD)):
        if mallopt(parameter, value) != 1:
            return f"mallopt({parameter}, {value}) refused"
    return None
