"""Run an example script on real ranks, the way a user would, and capture what it printed.

Examples are launched with torchrun's module (``python -m torch.distributed.run --standalone``),
which every PyTorch install has; each rank gets one thread and gloo pinned to loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHARED_DATA = ROOT / ".." / "shared" / "data"


def example_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment plus one thread per rank and gloo on loopback."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def torchrun_command(script: str, args: Sequence[str] = (), nproc: int = 2) -> list[str]:
    """The command line that starts ``examples/<script>`` on ``nproc`` local ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(EXAMPLES / script), *args]


def run_example(script: str, args: Sequence[str] = (), nproc: int = 2, timeout: float = 300.0,
                cwd: Path | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<script>`` on ``nproc`` ranks; stdout and stderr come back as text."""
    return subprocess.run(torchrun_command(script, args, nproc), cwd=cwd or ROOT, env=example_env(env),
                          capture_output=True, text=True, timeout=timeout)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    """Both streams of a finished run, for assertion messages."""
    return f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
