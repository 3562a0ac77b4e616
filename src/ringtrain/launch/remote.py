"""Reaching other hosts over ssh: the command line, the forwarded environment, and a reachability probe."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ringtrain.engine.auth import ENV_ADDRESS, ENV_SECRET
from ringtrain.exceptions import UsageError

#: Variables a remote agent needs from here: where Python and our package are, and every knob of the
#: libraries the workers use.
FORWARD_NAMES = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "PYTHONUNBUFFERED", "PYTHONHASHSEED", "MASTER_ADDR", "MASTER_PORT")
FORWARD_PREFIXES = ("HOROVOD_", "NCCL_", "GLOO_", "RINGTRAIN_", "TORCH_", "TORCHELASTIC_", "CUDA_")
#: Never forwarded: the job's secret (the driver sends it on the agent's stdin) and a job store address
#: (each node's agent tells its workers where node 0's store is).
PRIVATE_VARIABLES = (ENV_SECRET, ENV_ADDRESS)
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def forwarded_environment(environ: Mapping[str, str],
                          extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subset of ``environ`` (plus ``extra``) that a remote agent gets."""
    env = {k: v for k, v in environ.items()
           if _SAFE_NAME.match(k) and (k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES))}
    # CUDA_VISIBLE_DEVICES names this machine's GPUs, not the remote one's.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # The job's secret goes over the ssh session's stdin, never on the remote command line (which every
    # user of that host can read in `ps`).
    for name in PRIVATE_VARIABLES:
        env.pop(name, None)
    env.update(extra or {})
    return env


#: How ssh checks the hosts' keys: ``accept-new`` (default: a host's first key is recorded in the user's
#: known_hosts and trusted, a changed one is refused) or ``yes`` (only hosts whose key is already known).
#: Never ``no``: the driver sends each host's agent the job's secret once ssh has connected.
ENV_HOST_KEY_CHECKING = "RINGTRAIN_SSH_HOST_KEY_CHECKING"
HOST_KEY_CHECKING = ("accept-new", "yes")


def host_key_checking(environ: Mapping[str, str] | None = None) -> str:
    """ssh's ``StrictHostKeyChecking`` value from :data:`ENV_HOST_KEY_CHECKING`; a bad value is a
    :class:`UsageError` naming it and the fix."""
    value = (os.environ if environ is None else environ).get(ENV_HOST_KEY_CHECKING, "").strip().lower()
    if not value:
        return HOST_KEY_CHECKING[0]
    if value not in HOST_KEY_CHECKING:
        raise UsageError(f"{ENV_HOST_KEY_CHECKING}={value!r} is not one of {', '.join(HOST_KEY_CHECKING)}. "
                         "HINT: use yes to accept only hosts whose key is in your known_hosts, or unset it "
                         "for accept-new (a host's first key is trusted and recorded); there is no 'no': "
                         "every host is sent the job's secret.")
    return value


def ssh_base(host: str, port: int | None, identity_file: str | None, connect_timeout: float,
             alive_timeout: float | None = None) -> list[str]:
    """``ssh`` with batch mode (never prompt), host keys checked against the user's known_hosts
    (:func:`host_key_checking`), and a connect timeout.

    ``alive_timeout``: give up on a session whose host has not answered for about that long (ssh's
    ServerAlive probes), instead of at the kernel's TCP timeout, minutes later: a job spanning a host
    that went away ends within ``RINGTRAIN_PEER_TIMEOUT_SECONDS``.
    """
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={host_key_checking()}",
           "-o", "LogLevel=ERROR",
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


#: ssh's words for a host that is not up yet: its name not in DNS yet (a Kubernetes pod's DNS record
#: appears when the pod runs), nothing listening yet (sshd starting), no route or no answer yet.
_NOT_UP_YET = ("could not resolve hostname", "name or service not known", "temporary failure in name",
               "connection refused", "no route to host", "connection timed out", "network is unreachable",
               "no answer")
#: Seconds between two tries at a host that is not up yet.
RETRY_INTERVAL = 1.0


def probe_hosts(hosts: Sequence[str], port: int | None, identity_file: str | None, timeout: float) -> None:
    """Check in parallel that every host answers ``ssh host true`` within ``timeout`` seconds.

    A host that is not up yet (see ``_NOT_UP_YET``: worker pods start in any order, and their DNS names
    resolve only once they run) is tried again every ``RETRY_INTERVAL`` seconds until ``timeout``; any
    other failure (a refused key, say) is reported at once.
    """
    def attempt(host: str, limit: float) -> str | None:
        cmd = [*ssh_base(host, port, identity_file, limit), "true"]
        try:
            result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=limit + 5)
        except FileNotFoundError:
            return "the ssh client is not installed"
        except subprocess.TimeoutExpired:
            return "no answer"
        if result.returncode != 0:
            lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
            if host_key_refused(result.stderr):
                raise UsageError(host_key_message(host, result.stderr))
            return lines[-1].rstrip(".") if lines else f"ssh exited with code {result.returncode}"
        return None

    def probe(host: str) -> str | None:
        deadline = time.monotonic() + timeout
        tries = 0
        while True:
            tries += 1
            why = attempt(host, max(deadline - time.monotonic(), 1.0))
            left = deadline - time.monotonic()
            if why is None or not any(words in why.lower() for words in _NOT_UP_YET) or left <= 0:
                return f"{why} ({tries} tries)" if why and tries > 1 else why
            if tries == 1:  # said once: a pod still starting is normal, a name misspelt is not
                print(f"ringtrain run: {host} is not up yet ({why}); trying again for up to {left:.0f} s "
                      "(--start-timeout)", file=sys.stderr, flush=True)
            time.sleep(min(RETRY_INTERVAL, left))

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
                         "~/.ssh or -i FILE, port with -p); a host (or Kubernetes pod) still starting "
                         "was retried until then, so raise --start-timeout if it needs longer.")


def host_key_refused(stderr: str) -> bool:
    """ssh's words when it refused the host's key (it then exits 255 and sends nothing)."""
    return "host key verification failed" in stderr.lower()


def host_key_message(host: str, stderr: str) -> str:
    """What to tell the user when ssh refused ``host``'s key: which case it was, and the fix."""
    text = stderr.lower()
    if "identification has changed" in text or ("key for" in text and "has changed" in text):
        return (f"host {host}: ssh refused its host key (Host key verification failed): it is not the key "
                "known for that host in your known_hosts, so another machine may be answering at its "
                "address, and no job (nor its secret) was sent to it. HINT: if the host was reinstalled, "
                f"remove the old key with `ssh-keygen -R {host}` and check the new one with `ssh {host} "
                "true`; otherwise find out who answers there first.")
    if "no " in text and "host key is known" in text:
        return (f"host {host}: its key is not in your known_hosts and {ENV_HOST_KEY_CHECKING}=yes accepts "
                f"only known hosts (Host key verification failed). HINT: add its key (`ssh {host} true` once "
                f"and check the fingerprint, or ssh-keyscan {host} >> ~/.ssh/known_hosts after checking it), "
                f"or unset {ENV_HOST_KEY_CHECKING} to trust a host's first key (docs/security.md).")
    return (f"host {host}: ssh refused its host key (Host key verification failed); no job was sent to it. "
            f"HINT: check the host's key in your known_hosts (`ssh {host} true` shows what ssh objects to; "
            f"`ssh-keygen -R {host}` removes a stale one) (docs/security.md).")


def cwd_for_remote() -> str:
    """The folder remote agents change to (the same path is assumed to exist there)."""
    return os.getcwd()
