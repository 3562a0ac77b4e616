"""The link between a driver and what it started on a place (a host's agent, an elastic worker).

Both ends speak over the child's standard streams, the one channel ssh (or any backend) already
carries and the driver already holds:

* **The secret**: the first line on the child's stdin (:func:`send_secret`, :func:`read_secret`; they
  live with the rest of the job store's secret in :mod:`ringtrain.launch.store_host`), never on a
  command line.
* **Requests**, each on a line of its own on the child's stdin: :data:`STOP_REQUEST` (stop the ranks as
  on SIGTERM), :data:`KILL_REQUEST` (kill them now: a second Ctrl-C at the driver), ``signal NAME``
  (:data:`SIGNAL_REQUEST`: send the signal to every rank, e.g. a scheduler's SIGUSR1 warning). An
  empty line is a heartbeat; end-of-file means "stop" too (the driver is gone).
* **Heartbeats both ways**: the driver writes an empty line every :data:`BEAT_INTERVAL` seconds at most,
  the child writes :data:`ALIVE_LINE` on its stderr as often. Each side gives the other up after
  :func:`contact_timeout` seconds of silence (once it has heard from it at all: a child that never
  beats is not judged, so a program that cannot speak the link is still supervised by its exit).

The driver's end lives in :class:`DriverEnd` (used by :mod:`ringtrain.launch.supervision`); the
child's end is :func:`beat_to_driver` and :func:`watch_driver`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

from ringtrain.launch.forwarding import signal_pids
from ringtrain.launch.stopping import kill_process_groups
from ringtrain.launch.store_host import read_secret, send_secret

#: Most seconds between two heartbeats, each way, where a beat costs a pipe write (local, ssh, srun).
BEAT_INTERVAL = 1.0
#: Set by a driver on what it starts where every heartbeat is a round trip through a cluster manager
#: (a Ray actor call each way): the seconds between two beats there (:func:`sparse_beat_interval`).
ENV_BEAT_INTERVAL = "RINGTRAIN_LINK_BEAT_SECONDS"
#: The line a child writes on stderr as its heartbeat: the driver hears that its place is there.
ALIVE_LINE = "@@RINGTRAIN_ALIVE@@"
#: Requests a driver writes on a child's stdin, each on a line of its own (see the module doc).
STOP_REQUEST, KILL_REQUEST = b"stop", b"kill"
#: ``signal NAME`` (``signal SIGUSR1``): pass that signal on to the ranks (launch/forwarding.py).
SIGNAL_REQUEST = b"signal"


__all__ = ["ALIVE_LINE", "BEAT_INTERVAL", "ENV_BEAT_INTERVAL", "KILL_REQUEST", "SIGNAL_REQUEST",
           "STOP_REQUEST", "DriverEnd",
           "beat_interval", "beat_to_driver", "contact_timeout", "exit_after", "exit_when_children_gone",
           "forward_request", "host_log_path", "live_children", "note_on_host", "read_secret", "send_secret",
           "sparse_beat_interval", "watch_driver"]


def beat_interval(peer_timeout: float, environ: Mapping[str, str] | None = None) -> float:
    """Seconds between heartbeats for a silence limit of ``peer_timeout``: four fit in it, and at most
    :data:`BEAT_INTERVAL`, unless the driver set :data:`ENV_BEAT_INTERVAL` in ``environ`` (never more
    than a quarter of the limit either way)."""
    given = (environ or {}).get(ENV_BEAT_INTERVAL, "")
    try:
        interval = float(given) if given else BEAT_INTERVAL
    except ValueError:
        interval = BEAT_INTERVAL
    return min(interval if interval > 0 else BEAT_INTERVAL, peer_timeout / 4)


def sparse_beat_interval(peer_timeout: float) -> float:
    """Seconds between heartbeats where each one is a round trip through a cluster manager (Ray): a
    quarter of the silence limit, as the ranks beat each other (engine/liveness.py). A lost place is
    still noticed after the same ``peer_timeout`` of silence; a quiet job costs a round trip every few
    seconds instead of two a second, CPU that its ranks would otherwise lose."""
    return peer_timeout / 4


def contact_timeout(peer_timeout: float, max_restarts: int = 0) -> float:
    """Seconds of silence after which a driver and what it started give each other up.

    Without restarts a silent place ends its ranks after ``RINGTRAIN_PEER_TIMEOUT_SECONDS``. With
    ``--max-restarts`` the ranks still notice a cut link after that time and fail, but the launchers
    stay as patient as the rendezvous is with a missing node, so a short cut costs one restart, not the
    job.
    """
    if max_restarts <= 0:
        return peer_timeout
    from ringtrain.launch.rendezvous import NODE_TIMEOUT

    return max(peer_timeout, NODE_TIMEOUT)


# --- the driver's end ---------------------------------------------------------------------------

class Hearing:
    """What the driver hears of a child's heartbeats on its stderr, and the silence they measure: the
    half of a link that needs no stdin (a Ray actor's agent is written to through the actor)."""

    def __init__(self) -> None:
        #: When the child's last heartbeat arrived (None until the first).
        self.heard: float | None = None
        #: Seconds of silence after which the driver gave the child up (None: it did not).
        self.silent_for: float | None = None

    def heard_in(self, line: str) -> str | None:
        """For a line of the child's stderr: None when it is no heartbeat; else the text before the
        heartbeat that ends it (usually ''), which the relay joins to the rest of its line.

        A heartbeat can end a partial line where the child's own output shares the stream (an
        elastic worker's user code writes there too, e.g. a progress bar without a newline).
        """
        if line.endswith(ALIVE_LINE + "\n"):
            before = line[: -len(ALIVE_LINE) - 1]
        elif line.endswith(ALIVE_LINE):  # the last line, without its newline
            before = line[: -len(ALIVE_LINE)]
        else:
            return None
        self.heard = time.monotonic()
        return before

    def check_silence(self, limit: float) -> bool:
        """True (once) when the child, heard before, has said nothing for ``limit`` s."""
        if self.heard is None or self.silent_for is not None:
            return False
        silent = time.monotonic() - self.heard
        if silent <= limit:
            return False
        self.silent_for = silent
        return True


class DriverEnd(Hearing):
    """The driver's side of one link: the child's stdin to write on, what came back on its stderr.

    ``talks``: the child speaks the link from the start (a host's agent). Otherwise the driver waits
    for its first :data:`ALIVE_LINE` before it writes beats or requests: an elastic worker whose
    command is exec'd as another program never beats, and that program's stdin gets nothing of ours.
    """

    def __init__(self, stdin: IO[bytes] | None, talks: bool = True) -> None:
        super().__init__()
        self.stdin = stdin
        self.talks = talks
        self.stopping = False
        with contextlib.suppress(OSError, AttributeError, ValueError):
            if stdin is not None:
                os.set_blocking(stdin.fileno(), False)

    def heard_in(self, line: str) -> str | None:
        before = super().heard_in(line)
        if before is not None:
            self.talks = True  # it beats: it speaks the link
        return before

    def beat(self) -> None:
        """One heartbeat line on the child's stdin: it stops its ranks when they stop coming."""
        if self.stopping or not self.talks:
            return
        # A full pipe (a child or an ssh that does not read) skips a beat rather than block the driver.
        self.write(b"\n")

    def stop(self) -> None:
        """A stop request (the stream stays open for a kill request), or end-of-file where the child
        does not speak the link or the request cannot be written."""
        self.stopping = True
        if not (self.talks and self.request(STOP_REQUEST)):
            self.close()

    def forward(self, signum: int) -> bool:
        """Ask the child to send ``signum`` to its ranks; False where it does not speak the link (or the
        request cannot be written)."""
        if not self.talks:
            return False
        return self.request(SIGNAL_REQUEST + b" " + signal.Signals(signum).name.encode())

    def kill(self) -> bool:
        """A kill request, then end-of-file; False where the child does not speak the link."""
        self.stopping = True
        if not self.talks:
            return False
        self.request(KILL_REQUEST)
        self.close()
        return True

    def request(self, request: bytes) -> bool:
        return self.write(request + b"\n")

    def write(self, data: bytes) -> bool:
        """``data`` on the child's stdin, whole; False where it could not be written (a full pipe, a
        child gone, stdin already closed). A link over another channel (a Ray node's bridge) overrides
        this and :meth:`close`."""
        if self.stdin is None:
            return False
        try:
            return os.write(self.stdin.fileno(), data) == len(data)
        except (OSError, ValueError, AttributeError):
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if self.stdin is not None:
                self.stdin.close()


# --- the child's end ----------------------------------------------------------------------------

def beat_to_driver(interval: float) -> threading.Thread:
    """Write :data:`ALIVE_LINE` on stderr every ``interval`` s: the driver's sign that this place is
    reachable (it reports one it has not heard from for RINGTRAIN_PEER_TIMEOUT_SECONDS as lost)."""
    def beat() -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                sys.stderr.write(ALIVE_LINE + "\n")
                sys.stderr.flush()
                time.sleep(interval)

    thread = threading.Thread(target=beat, name="ringtrain-alive", daemon=True)
    thread.start()
    return thread


def watch_driver(silence_s: float, host: str, *, ranks: Callable[[], Iterable[int]],
                 after_stop: Callable[[], None], whose: str = "the ranks of this host",
                 on_line: Callable[[bytes], object] | None = None) -> threading.Thread:
    """Stop when the driver asks or goes away; kill ``ranks()`` at once when it asks; send them a signal
    when it asks (:data:`SIGNAL_REQUEST`); any other request line goes to ``on_line``.

    :data:`STOP_REQUEST` or end-of-file on stdin means SIGTERM to ourselves (torch's agent then stops
    its ranks; an elastic worker's own handlers run); :data:`KILL_REQUEST` means SIGKILL to every
    process group of ``ranks()``. After the stop, ``after_stop()`` runs on this thread: it bounds how
    long this process may take to end.

    Once a heartbeat has arrived, ``silence_s`` (``RINGTRAIN_PEER_TIMEOUT_SECONDS``) without another
    means the driver's host is unreachable or the link to it is cut (ssh would notice only at the
    kernel's TCP timeout, minutes later), and ``whose`` ranks are stopped too. A child whose driver never
    beats judges only EOF; one that was asked to stop hears no more beats and keeps listening for a kill
    request.
    """
    def watch() -> None:
        heard, last, stopping, partial = False, time.monotonic(), False, b""
        reason = ""
        # os.read on the raw descriptor: a daemon thread blocked in sys.stdin would hold its lock at exit.
        with contextlib.suppress(OSError, ValueError):
            while True:
                ready, _, _ = select.select([0], [], [], 1.0)
                if ready:
                    data = os.read(0, 4096)
                    if not data:
                        reason = (f"the launcher closed the link (it ended, or its ssh session did); "
                                  f"stopping {whose}.")
                        break
                    heard, last = True, time.monotonic()
                    *lines, partial = (partial + data).split(b"\n")
                    if KILL_REQUEST in lines:
                        kill_process_groups(ranks())
                        break
                    for line in lines:
                        if line.startswith(SIGNAL_REQUEST + b" "):
                            forward_request(line, ranks)
                        elif on_line is not None and line and line not in (STOP_REQUEST, KILL_REQUEST):
                            on_line(line)  # a request of the watch's (ringtrain.watch.node)
                    if STOP_REQUEST in lines and not stopping:
                        stopping = True
                        os.kill(os.getpid(), signal.SIGTERM)
                elif heard and not stopping and time.monotonic() - last > silence_s:
                    reason = (f"no word from the launcher for {silence_s:g} s "
                              "(RINGTRAIN_PEER_TIMEOUT_SECONDS): its host is unreachable or the network to "
                              f"it is cut; stopping {whose}.")
                    break
        if not stopping:
            # Said here too: across a cut link (or with the launcher gone) the stderr line reaches nobody.
            if reason:
                note_on_host(host, reason)
                # On a thread of its own: the stop must not wait on this line (a launcher gone leaves a
                # broken pipe; a cut link, an ssh whose pipe may fill and block the write).
                threading.Thread(target=_say, args=(f"ringtrain run: host {host}: {reason}",),
                                 name="ringtrain-stop-reason", daemon=True).start()
            os.kill(os.getpid(), signal.SIGTERM)
        after_stop()

    thread = threading.Thread(target=watch, name="ringtrain-stdin-watch", daemon=True)
    thread.start()
    return thread


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def forward_request(line: bytes, ranks: Callable[[], Iterable[int]]) -> None:
    """``signal NAME``: send that signal to ``ranks()``; a name that is no signal is ignored (a newer
    driver's request this child does not know)."""
    name = line[len(SIGNAL_REQUEST):].strip().decode(errors="replace")
    signum = getattr(signal.Signals, name, None)
    if signum is not None:
        signal_pids(ranks(), signum)


#: The file on each host where an agent (or elastic worker) notes why it stopped on its own.
HOST_LOG_NAME = "ringtrain-agents-{uid}.log"


def host_log_path() -> Path:
    """This user's log of stops decided on this host, in the temporary directory (``$TMPDIR``)."""
    return Path(tempfile.gettempdir()) / HOST_LOG_NAME.format(uid=os.getuid())


def note_on_host(host: str, reason: str) -> None:
    """Append one line (time, host, pid, reason) to :func:`host_log_path`: the far side's record of why it
    stopped when its stderr could not reach the launcher. Never fails the stop."""
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with contextlib.suppress(OSError), open(host_log_path(), "a") as log:
        log.write(f"{when} host {host} pid {os.getpid()}: {reason}\n")


def exit_when_children_gone() -> None:
    """An agent's end after a stop: exit as soon as none of its worker processes is left.

    The agent's main thread can sit in a blocking store call (the exit barrier after its ranks
    finished, or a rendezvous) where Python signal handlers do not run; once no child is left,
    exiting at once is safe.
    """
    while True:
        time.sleep(1.0)
        children = live_children(os.getpid())
        if not children:
            _exit(128 + signal.SIGTERM)
        # A stopped rank (SIGSTOP, a debugger) takes the agent's SIGTERM only once it runs again;
        # without this it would be killed only after the agent's 30 s grace.
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def exit_after(grace_s: float) -> Callable[[], None]:
    """A worker's end after a stop: a hard exit ``grace_s`` later, for a command that ignores SIGTERM."""
    def end() -> None:
        time.sleep(grace_s)
        _exit(128 + signal.SIGTERM)

    return end


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def live_children(pid: int) -> list[int]:
    """Pids of the living (not zombie) children of ``pid``, read from /proc; [] where there is none."""
    children = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fp:
                fields = fp.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.append(int(entry))
    return children
