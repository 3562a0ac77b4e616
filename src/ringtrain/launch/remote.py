"""Reaching other hosts over ssh: the command line, the forwarded environment, and a reachability probe."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ringtrain.exceptions import UsageError

#: Variables a remote agent needs from here: where Python and our package are, and every knob of the
#: libraries the workers use.
FORWARD_NAMES = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "PYTHONUNBUFFERED", "PYTHONHASHSEED", "MASTER_ADDR", "MASTER_PORT")
FORWARD_PREFIXES = ("HOROVOD_", "NCCL_", "GLOO_", "RINGTRAIN_", "TORCH_", "TORCHELASTIC_", "CUDA_")
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def forwarded_environment(environ: Mapping[str, str],
                          extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subset of ``environ`` (plus ``extra``) that a remote agent gets."""
    env = {k: v for k, v in environ.items()
           if _SAFE_NAME.match(k) and (k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES))}
    # CUDA_VISIBLE_DEVICES names this machine's GPUs, not the remote one's.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # The job's secret never goes on a command line (ps shows it on both hosts): the driver sends it
    # to each agent on its stdin.
    env.pop("RINGTRAIN_JOB_SECRET", None)
    env.update(extra or {})
    return env


def ssh_base(host: str, port: int | None, identity_file: str | None, connect_timeout: float,
             alive_timeout: float | None = None) -> list[str]:
    """``ssh`` with batch mode (never prompt), no host-key question, and a connect timeout.

    ``alive_timeout``: give up on a session whose host has not answered for about that long (ssh's
    ServerAlive probes), instead of at the kernel's TCP timeout, minutes later: a job spanning a host
    that went away ends within ``RINGTRAIN_PEER_TIMEOUT_SECONDS``.
    """
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR",
           "-o", f"ConnectTimeout={max(int(connect_timeout), 1)}"]
    if alive_timeout:
        interval = max(1, round(alive_timeout / 4))
        cmd += ["-o", f"ServerAliveInterval={interval}", "-o", "ServerAliveCountMax=4"]
    if port:
        cmd += ["-p", str(port)]
    if identity_file:
        cmd += ["-i", identity_file]
    return [*cmd, host]


def remote_command(host: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, port: int | None,
                   identity_file: str | None, connect_timeout: float,
                   alive_timeout: float | None = None) -> list[str]:
    """``ssh host 'cd <cwd> && env K=V ... argv'``: the remote shell sees one quoted command."""
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    script = f"cd {shlex.quote(cwd)} && exec env {assignments} {shlex.join(argv)}"
    return [*ssh_base(host, port, identity_file, connect_timeout, alive_timeout), script]


def probe_hosts(hosts: Sequence[str], port: int | None, identity_file: str | None, timeout: float) -> None:
    """Check in parallel that every host answers ``ssh host true`` within ``timeout`` seconds."""
    def probe(host: str) -> str | None:
        cmd = [*ssh_base(host, port, identity_file, timeout), "true"]
        try:
            result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=timeout + 5)
        except FileNotFoundError:
            return "the ssh client is not installed"
        except subprocess.TimeoutExpired:
            return "no answer"
        if result.returncode != 0:
            lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
            return lines[-1] if lines else f"ssh exited with code {result.returncode}"
        return None

    if not hosts:
        return
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        problems = [(h, p) for h, p in zip(hosts, pool.map(probe, hosts)) if p]
    if problems:
        host, why = problems[0]
        others = f" (and {len(problems) - 1} more: {', '.join(h for h, _ in problems[1:])})" \
            if len(problems) > 1 else ""
        raise UsageError(f"host {host} unreachable over ssh within {timeout:g} s: {why}{others}. "
                         f"HINT: check that 'ssh {host} true' works without a password (keys in "
                         "~/.ssh or -i FILE, port with -p), or raise --start-timeout.")


def cwd_for_remote() -> str:
    """The folder remote agents change to (the same path is assumed to exist there)."""
    return os.getcwd()
