"""What the integration fixtures share: skip reasons, daemons that die with the test session.

Every daemon a fixture starts runs in the foreground as a child of the pytest process, with the
kernel told to SIGTERM it when pytest dies (``PR_SET_PDEATHSIG``): a crashed or killed test session
leaves no slurmctld, munged or sshd behind. Teardown also stops them explicitly.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT / ".." / "shared" / "data"
_PR_SET_PDEATHSIG = 1


def skip_unless_root(what: str) -> None:
    """Skip the calling test or fixture when not root: ``what`` says what needed root."""
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root (run the integration tests as root, as CI does)")


def skip_unless_commands(*commands: str) -> dict[str, str]:
    """Skip unless every command is installed; returns their absolute paths."""
    found = {}
    missing = []
    for command in commands:
        path = shutil.which(command) or shutil.which(command, path="/usr/sbin:/sbin:/usr/bin:/bin")
        if path is None:
            missing.append(command)
        else:
            found[command] = path
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: install them with `sudo bash .ci/system-setup`")
    return found


def ringtrain_argv(*args: str) -> list[str]:
    """``ringtrain ARGS`` with this interpreter, so it works from any venv without PATH games."""
    return [sys.executable, "-m", "ringtrain", *args]


def script_interpreter_flags() -> list[str]:
    """``ringtrain script`` flags that make a job find this ringtrain: the venv to activate (how a user
    would say it), or this interpreter where the tests run outside a venv."""
    if sys.prefix != sys.base_prefix:
        return ["--venv", sys.prefix]
    return ["--python", sys.executable]


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn_daemon(argv: Sequence[str], log: Path,
                 env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a foreground daemon that dies with this process; its output goes to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, preexec_fn=_die_with_parent)


def stop_daemons(procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM each daemon, then SIGKILL what has not exited after ``grace`` seconds."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.2,
             logs: Sequence[Path] = ()) -> None:
    """Poll ``condition`` until true; on timeout fail with ``what`` and the tail of each log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    tails = "\n".join(f"--- {log}:\n{tail(log)}" for log in logs)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}\n{tails}")


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a text file, or a note that it does not exist."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no such file)"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without launcher variables that would confuse a nested job.

    A test session started inside a Slurm job, under torchrun or mpirun must not leak its own
    rank variables into the jobs it launches.
    """
    drop_prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HOROVOD_", "TORCHELASTIC_", "PET_")
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RINGTRAIN_JOB_SECRET", "RINGTRAIN_JOB_STORE"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(drop_prefixes)}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    # Daemons and ip/tc live in sbin, which a non-login root shell may lack on its PATH.
    path = env.get("PATH", "/usr/bin:/bin").split(":")
    env["PATH"] = ":".join(path + [d for d in ("/usr/sbin", "/sbin") if d not in path])
    env.update(extra or {})
    return env
