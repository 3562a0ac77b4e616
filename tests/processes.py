"""Looking at processes from tests, the way the kernel sees them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def owns_two_or_more_cpus() -> bool:
    """This process may run on every online CPU, and there are at least two (binding tests need both)."""
    usable = len(os.sched_getaffinity(0))
    return usable >= 2 and usable >= (os.cpu_count() or 0)


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (whether init reaps orphans depends on the container)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition: Callable[[], object], timeout: float = 60.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` s have passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
