"""First code of an elastic worker: ``python -m ringtrain.launch.elastic_worker COMMAND...``.

The elastic driver (:mod:`ringtrain.launch.elastic_driver`) starts one per slot, with the worker's
variables in its environment (see :mod:`ringtrain.engine.elastic_rendezvous`). This module:

1. reads the job's secret from the first line of stdin when the driver says so
   (``RINGTRAIN_SECRET_ON_STDIN=1``: workers started over ssh, whose command line is visible in
   ``ps`` on the remote host); local workers find it in their environment;
2. speaks the driver's link (:mod:`ringtrain.launch.link`): a stop request, end-of-file on stdin
   (the driver closed it, or died, or the ssh session broke) or the driver's silence for
   ``RINGTRAIN_PEER_TIMEOUT_SECONDS`` means SIGTERM and a hard exit after the shared grace; a kill
   request (a second Ctrl-C at the driver) kills this worker and its children at once; and a worker
   that runs Python here beats on stderr, so that the driver notices a host gone silent. The
   kernel's parent-death signal covers a local driver killed outright;
3. reaches the job store once and says so (``elastic/worker/<id>/alive``), so that the driver tells a
   host that cannot run workers at all (ssh refused, store unreachable) from a worker that crashed;
4. runs the command as :mod:`ringtrain.launch.worker_entry` does: Python in this very process,
   anything else through ``exec``.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

from ringtrain.engine.settings import read_knob
from ringtrain.launch import link
from ringtrain.launch.supervision import SHUTDOWN_GRACE
from ringtrain.launch.worker_entry import die_with_parent, run_command, runs_in_process

ENV_SECRET_ON_STDIN = "RINGTRAIN_SECRET_ON_STDIN"
#: Exit code when the driver's job store cannot be reached from this host.
UNREACHABLE_EXIT = 3


def speak_link(argv: Sequence[str]) -> None:
    """The worker's end of the driver's link (see the module doc)."""
    peer_timeout = float(read_knob("peer_timeout_s", os.environ))
    # the driver's word for this place's beats, not the user's program's business
    given = os.environ.pop(link.ENV_BEAT_INTERVAL, "")
    beat_every = link.beat_interval(peer_timeout, {link.ENV_BEAT_INTERVAL: given})
    pid = os.getpid()
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    # a kill request ends the worker's own children first, then the worker with its process group
    link.watch_driver(link.contact_timeout(peer_timeout), host, ranks=lambda: [*link.live_children(pid), pid],
                      after_stop=link.exit_after(SHUTDOWN_GRACE), whose="this worker")
    # A command exec'd as another program would leave the beats behind, and its stdin must get nothing
    # of ours: only a worker that runs Python here says it speaks the link.
    if runs_in_process(list(argv)):
        link.beat_to_driver(beat_every)


def announce(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Reach the job store and record that this worker started; an error message when it cannot."""
    from ringtrain.engine import elastic_rendezvous, job_store

    address = job_store.address_from_environ(environ)
    worker = environ.get(elastic_rendezvous.ENV_WORKER, "")
    timeout = float(environ.get("HOROVOD_START_TIMEOUT", "30") or 30)
    try:
        store = job_store.JobStore(address or "", job_store.secret_from_environ(environ),
                                  timeout=max(timeout, 5.0))
        store.set(elastic_rendezvous.alive_key(worker), str(os.getpid()))
        store.close()
    except (ConnectionError, OSError, ValueError) as exc:
        host = environ.get("HOROVOD_HOSTNAME", "?")
        return (f"ringtrain elastic: worker {worker} on {host} cannot reach the driver's job store at "
                f"{address}: {exc}. HINT: the driver's host must be reachable from {host} on TCP; set "
                "--network-interfaces to the interface the hosts share, or open the port in the firewall.")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Set up the worker, then run or exec the command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("ringtrain.launch.elastic_worker: no command given", file=sys.stderr)
        return 2
    die_with_parent()
    if os.environ.pop(ENV_SECRET_ON_STDIN, "") == "1":
        from ringtrain.engine.auth import ENV_SECRET

        try:
            os.environ[ENV_SECRET] = link.read_secret() or ""
        except EOFError:  # the driver (or its ssh session) went away before the handover
            print("ringtrain elastic: the driver went away before handing over the job's secret; the worker "
                  "did not start", file=sys.stderr, flush=True)
            return UNREACHABLE_EXIT
    speak_link(argv)
    problem = announce(os.environ)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return UNREACHABLE_EXIT
    return run_command(list(argv))


if __name__ == "__main__":
    sys.exit(main())
