"""Who hosts the job store the node agents meet on, where it listens, and where its secret comes from.

All of those decisions live here, in one small place:

* **Who hosts.** Node 0's agent (:func:`host_job_store`): the launcher process itself for a job on
  this machine alone, the agent a driver or ``srun`` started on the first host, or the ``ringtrain
  run --node-rank 0`` a user started by hand. It listens on the rendezvous endpoint's port
  (``--master-port`` / ``--rdzv-endpoint``; a free port for a one-host job).
* **Where it listens** (:func:`bind_address`): 127.0.0.1 when the endpoint is a loopback name;
  the endpoint's own address when this host owns it; every interface only when the others reach
  this host by an address it cannot bind (a name that resolves to loopback here, NAT). Every
  connection must prove the secret either way.
* **The secret** (:func:`node_secret`): ``RINGTRAIN_JOB_SECRET`` when set (a user or a scheduler
  script exported one for every node); else a fresh one when this process starts the whole job
  (one host, or a driver that hands it to its agents); else none, and the job runs unauthenticated
  with one warning (nodes started by hand, each its own ``ringtrain run``, share nothing else).
  A driver hands the secret to each agent as the first line on the agent's stdin
  (:func:`send_secret` / :func:`read_secret`): never on a command line, which ``ps`` shows on every
  host, and over ssh stdin is the one channel the driver already holds.

The workers get the secret in their environment (``RINGTRAIN_JOB_SECRET``).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections.abc import Mapping
from typing import IO

from ringtrain.engine import auth
from ringtrain.engine.job_store import JobStoreServer, split_address
from ringtrain.exceptions import SettingError, UsageError
from ringtrain.launch.hosts import is_loopback_name

#: Seconds an agent waits for its driver's secret line before it goes on without one.
SECRET_LINE_TIMEOUT = 60.0


def node_secret(environ: Mapping[str, str], whole_job_here: bool, given: str | None = None) -> str | None:
    """The job's secret for this node: ``given`` (from a driver), the environment's, a new one, or None.

    ``whole_job_here``: this process starts every rank of the job (a one-host job, or a driver), so
    a secret it makes reaches everybody. Otherwise, with nothing exported, the rendezvous runs
    unauthenticated and a warning says how to fix that.
    """
    if given:
        return given
    try:
        secret = auth.secret_from_environ(environ)
    except SettingError as exc:  # a user's export, refused: a usage error (exit 2), not a crash
        raise UsageError(str(exc)) from None
    if secret is not None:
        return secret
    if whole_job_here:
        return auth.new_secret()
    auth.warn_unauthenticated("this job's rendezvous (nodes started one by one)")
    return None


def bind_address(host: str) -> str:
    """The address node 0's job store listens on for an endpoint named ``host`` (see module doc)."""
    if is_loopback_name(host):
        return "::1" if host == "::1" else "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return "0.0.0.0"
    for family, _, _, _, sockaddr in infos:
        address = sockaddr[0]
        if not isinstance(address, str):  # an AF_INET or AF_INET6 address is a str
            continue
        if address.startswith("127.") or address == "::1":
            continue  # e.g. Debian's 127.0.1.1 for the own host name: the others use another address
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
        except OSError:
            continue
        return address
    return "0.0.0.0"


def host_job_store(endpoint: str, secret: str | None,
                   environ: Mapping[str, str] | None = None) -> JobStoreServer:
    """Node 0: serve the job store on ``endpoint``'s port; UsageError naming the port when it is taken.

    A connection gets ``RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS`` (of ``environ``, default this process's)
    to prove the secret.
    """
    from ringtrain.engine.settings import read_knob

    host, port = split_address(endpoint)
    try:
        handshake = float(read_knob("handshake_timeout_s", os.environ if environ is None else environ))
    except SettingError as exc:
        raise UsageError(str(exc)) from None
    try:
        return JobStoreServer(secret, host=bind_address(host), port=port, handshake_timeout=handshake)
    except OSError as exc:
        raise UsageError(f"master port {port} cannot be used on this host for the rendezvous ({exc}). HINT: "
                         "pick another with --master-port, or leave it out to use a free port.") from None


def send_secret(stream: IO[bytes] | None, secret: str | None) -> None:
    """Driver: the secret as the first line on an agent's stdin (an empty line: none)."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write((secret or "").encode() + b"\n")
        stream.flush()


def read_secret(fd: int = 0, timeout: float = SECRET_LINE_TIMEOUT) -> str | None:
    """Agent started by a driver: the first line of stdin, read byte by byte (the rest stays unread).

    None for an empty line or none within ``timeout``; EOFError when stdin ends before the line does
    (the driver went away: nothing may start).
    """
    line = bytearray()
    deadline = time.monotonic() + timeout
    while len(line) < 1024:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        byte = os.read(fd, 1)
        if not byte:
            raise EOFError("stdin ended before the driver's secret line")
        if byte == b"\n":
            break
        line += byte
    return line.decode(errors="replace").strip() or None
