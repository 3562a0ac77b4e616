"""What the numbers were measured on: CPU, cores, memory, GPUs, versions, date, source commit."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), or what ``platform`` knows elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return found.group(1).strip() if found else (platform.processor() or "unknown CPU")


def boot_id() -> str | None:
    """The running kernel's boot id: processes on one machine share it, network-namespace hosts too."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def memory_bytes() -> int | None:
    """Physical memory of this machine (None where it cannot be read)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.M)
    return int(found.group(1)) * 1024 if found else None


def gpus() -> list[str]:
    """Names of the CUDA devices torch sees (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def source_commit() -> str | None:
    """The git commit of ringtrain's source, when it runs from a checkout (with ``+dirty`` if edited)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def describe_machine() -> dict[str, Any]:
    """This machine and software, for scaling.json."""
    import torch

    import ringtrain

    usable: int | None  # os.cpu_count() is None where the count is unknown
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_bytes": memory_bytes(),
        "gpus": gpus(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ringtrain": ringtrain.__version__,
        "commit": source_commit(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def one_line(machine: dict[str, Any]) -> str:
    """``Intel Xeon ..., 2 cores, 24 GiB, no GPU; torch 2.13.0, ringtrain 0.1.0 (abc123)``."""
    memory = f", {machine['memory_bytes'] / 2**30:.0f} GiB" if machine.get("memory_bytes") else ""
    gpu = ", ".join(machine.get("gpus") or []) or "no GPU"
    commit = f" ({machine['commit']})" if machine.get("commit") else ""
    return (f"{machine['cpu']}, {machine['cores']} cores{memory}, {gpu}; torch {machine['torch']}, "
            f"ringtrain {machine['ringtrain']}{commit}; {machine['date']}")
