"""Run an example script on real ranks, the way a user would, and read what it printed.

Examples start under ``ringtrain run -np N python examples/<script>`` (the project's launcher, which
prefixes each output line with ``[rank] ``) or under torchrun's module
(``python -m torch.distributed.run --standalone``); each rank gets one thread and gloo on loopback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHARED_DATA = ROOT / ".." / "shared" / "data"
LAUNCHERS = ("ringtrain", "torchrun")


def example_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment plus one thread per rank and gloo on loopback."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def launch_command(script: str, args: Sequence[str] = (), nproc: int = 2,
                   launcher: str = "ringtrain") -> list[str]:
    """The command line that starts ``examples/<script>`` on ``nproc`` local ranks."""
    path = str(EXAMPLES / script)
    if launcher == "ringtrain":
        return [sys.executable, "-m", "ringtrain", "run", "-np", str(nproc), sys.executable, path, *args]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                path, *args]
    raise ValueError(f"launcher={launcher!r} is not one of {LAUNCHERS}")


def run_example(script: str, args: Sequence[str] = (), nproc: int = 2, launcher: str = "ringtrain",
                timeout: float = 300.0, cwd: Path | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<script>`` on ``nproc`` ranks; stdout and stderr come back as text.

    A run that outlives ``timeout`` is killed with every process it started, and the test fails with
    what it had printed so far.
    """
    command = launch_command(script, args, nproc, launcher)
    proc = subprocess.Popen(command, cwd=cwd or ROOT, env=example_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{' '.join(command)} did not finish within {timeout:.0f}s\n--- stdout ---\n"
                             f"{stdout}\n--- stderr ---\n{stderr}") from None
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def unprefixed(text: str) -> str:
    """``text`` without the ``[rank] `` that ``ringtrain run`` puts before each worker line."""
    return re.sub(r"^\[\d+\] ", "", text, flags=re.M)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    """Both streams of a finished run, for assertion messages."""
    return f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux ``/proc``), children before grandchildren."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command name may hold spaces and parentheses: the fields after the last ')' are fixed
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process it started, as a crashed node would go.

    torchrun's agent puts each worker in its own session, so killing the launcher's process group
    would leave the workers running: they are found through their parents first.
    """
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
