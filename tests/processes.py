"""Looking at processes from tests, the way the kernel sees them."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (whether init reaps orphans depends on the container)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
