"""Temporary folders of a launcher that a SIGKILL cannot strand: each names its host and pid, and the next
start removes those whose launcher is gone.

A launcher killed with SIGKILL (an OOM kill, a scheduler's hard stop) runs no clean-up, so its folder
(job spec, rank error files, default snapshots, logs) stayed in the temporary directory for ever.
:func:`make_temp_folder` first removes the folders of dead launchers of this host and this user, then
makes its own: ``<prefix><host>-<pid>-<random>``. A folder whose pid is alive (or was reused by a live
process) is kept; one of another host (a temporary directory shared between hosts) is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40] or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process holds the pid
    return True


def remove_stale(prefix: str, folder: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove ``prefix`` folders left by dead launchers of this host and user; returns what went."""
    root = Path(folder or tempfile.gettempdir())
    pattern = re.compile(re.escape(prefix + _host_tag()) + r"-(\d+)-[^/]*$")
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = pattern.match(entry.name)
            if not match or int(match.group(1)) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                    continue
                if not _alive(int(match.group(1))):
                    shutil.rmtree(entry)
                    removed.append(entry)
    return removed


def make_temp_folder(prefix: str) -> Path:
    """A new temporary folder ``<prefix><host>-<pid>-...`` after removing those of dead launchers."""
    remove_stale(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{_host_tag()}-{os.getpid()}-"))


__all__ = ["make_temp_folder", "remove_stale"]
