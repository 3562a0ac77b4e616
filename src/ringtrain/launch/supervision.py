"""Supervising groups of ranks on their places: the one layer both drivers stand on.

A *place* is where a group of ranks runs: this machine, a host reached over ssh, the tasks of an
``srun`` step (each in :mod:`ringtrain.launch.places`, named in its table ``PLACES``). A driver asks a
place to start a command with an environment and gets a :class:`RankGroup` back, whatever the place:

* the group's output reaches this process's stdout/stderr line by line (the lines carry their rank
  prefix from where they were written); a tail of its stderr is kept for reports;
* its exit status (:meth:`RankGroup.poll`);
* :meth:`~RankGroup.forward_signal` passes a signal on to its ranks (:mod:`ringtrain.launch.forwarding`);
* :meth:`~RankGroup.stop` asks its ranks to stop; :func:`stop_all` gives them
  :data:`SHUTDOWN_GRACE` seconds, kills them at once on a second Ctrl-C (:class:`StopSignals`) and
  kills what is left after the grace;
* liveness: :meth:`~RankGroup.beat` and :meth:`~RankGroup.check_silence` (the heartbeats of
  :mod:`ringtrain.launch.link`).

:class:`ProcessGroup` implements all of that for places reached through a child process of this
one (the local, ssh and srun places); a backend without such a process (Ray actors, Kubernetes
pods) builds on :class:`RelayedGroup` (the output relay, the heartbeats heard, the silence, with no
process of its own) or implements :class:`RankGroup` itself. docs/architecture.md walks through
adding one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, ClassVar

from ringtrain.launch.link import DriverEnd, Hearing
from ringtrain.launch.stopping import REPEAT_AFTER_S, killing_line

#: Seconds a group gets to stop its ranks after the stop request before it is killed (both drivers).
SHUTDOWN_GRACE = 30.0
#: Lines of a group's stderr kept for its failure report.
TAIL_LINES = 20
#: Seconds between two looks of a supervising loop.
TICK = 0.05


@dataclass(frozen=True)
class Reach:
    """How a driver reaches places that are not this machine (ssh's settings; places here ignore it)."""

    port: int | None = None
    identity_file: str | None = None
    connect_timeout: float = 30.0
    #: Give up on a session whose host has not answered for about this long (None: ssh's default).
    alive_timeout: float | None = None
    #: The folder the command starts in there (None: this process's).
    cwd: str | None = None


class RankGroup(ABC):
    """A group of ranks on one place, as a driver supervises it (see the module doc).

    ``host`` names the place in messages. ``env`` is what the ranks get: on this machine the whole
    environment (None: this process's); elsewhere the variables sent along (the place supplies the
    rest). ``talks``: the started command speaks :mod:`ringtrain.launch.link` from its start (a host's
    agent); otherwise the driver waits for its first heartbeat before it writes anything to it.
    ``on_error_line``: sees each stderr line first; True keeps it off the console and the tail (a
    driver's failure markers).
    """

    #: The place's name in :data:`ringtrain.launch.places.PLACES`.
    kind: ClassVar[str]

    host: str
    #: The last lines of the group's stderr.
    tail: list[str]
    #: When this driver first saw the group ended (wall-clock time), None while it runs.
    ended_at: float | None

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status once the group has ended (negative: killed by that signal), else None."""

    @property
    @abstractmethod
    def pid(self) -> int:
        """The pid that stands for the group on this machine (in reports)."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; the exit status (``subprocess.TimeoutExpired`` after ``timeout``)."""

    @abstractmethod
    def beat(self) -> None:
        """Tell the group this driver is alive (nothing where the group does not listen)."""

    @abstractmethod
    def check_silence(self, limit: float) -> bool:
        """True (once) when the group, heard from before, has been silent for ``limit`` s."""

    @property
    @abstractmethod
    def silent_for(self) -> float | None:
        """Seconds of silence after which :meth:`check_silence` gave the group up (None: never)."""

    @abstractmethod
    def stop(self) -> None:
        """Ask the ranks to stop (as on SIGTERM); :func:`stop_all` bounds how long they take."""

    @abstractmethod
    def kill_ranks(self) -> None:
        """Kill the ranks now (a second Ctrl-C at the driver)."""

    @abstractmethod
    def kill(self) -> None:
        """Kill what stands for the group here, now (after the grace, or once it is lost)."""

    @abstractmethod
    def join_output(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the group's last output to be relayed."""

    def forward_signal(self, signum: int) -> bool:
        """Pass ``signum`` on to every rank of the group (launch/forwarding.py); False where this place
        cannot (the default)."""
        return False

    def request(self, line: bytes) -> bool:
        """Send one request line to the group's agent (the watch's ``stacks ID``); False where this place
        cannot (the default) or the group has ended."""
        return False

    def unreachable(self) -> bool:
        """The place could not be reached at all (nothing of the ranks ran), as far as its exit says."""
        return False

    def lost_contact(self) -> bool:
        """The place stopped answering (a timeout of its transport), as far as its exit says."""
        return False

    def describe_end(self, what: str) -> str:
        """Why ``what`` (e.g. "the agent of node 1") ended without a report of its ranks."""
        code = self.poll()
        if code is not None and code < 0:
            return f"{what} on host {self.host} was killed by {signal.Signals(-code).name}"
        return f"{what} ({self.kind}) ended without a report"

    def last_error(self) -> str:
        """The last non-empty line of the group's stderr ('' if none)."""
        lines = [line.strip() for line in self.tail if line.strip()]
        return lines[-1] if lines else ""


class RelayedGroup(RankGroup):
    """What a group needs without a local process: its name, the relay of its output lines to this
    process's console (the heartbeats taken out of its stderr, a tail of the rest kept) and the
    silence those heartbeats measure. :class:`ProcessGroup` and the Ray place build on it.

    ``hearing``: where heartbeats are heard (a :class:`~ringtrain.launch.link.DriverEnd` that also
    writes to the child; a bare :class:`~ringtrain.launch.link.Hearing` by default).
    """

    def __init__(self, host: str, *, lock: threading.Lock | None = None,
                 on_error_line: Callable[[str], bool] | None = None,
                 out: IO[str] | None = None, err: IO[str] | None = None,
                 hearing: Hearing | None = None) -> None:
        self.host = host
        self.tail = []
        self.ended_at = None
        self.lock = lock or threading.Lock()
        self._on_error_line = on_error_line
        self._out, self._err = out or sys.stdout, err or sys.stderr
        self.hearing = hearing or Hearing()

    def _relay_line(self, line: str, is_err: bool, held: str = "") -> str:
        """Relay one line of the group's output (``held``: the text a heartbeat ended on that stream
        before, which this line goes on); returns what to hold for the stream's next line."""
        line = held + line
        if is_err:
            before = self.hearing.heard_in(line)
            if before is not None:
                return before
            if self._on_error_line is not None and self._on_error_line(line):
                return ""
        self._write(line, is_err)
        return ""

    def _write(self, line: str, is_err: bool) -> None:
        with self.lock:
            if is_err:
                self.tail = (self.tail + [line])[-TAIL_LINES:]
            dest = self._err if is_err else self._out
            dest.write(line)
            dest.flush()

    def check_silence(self, limit: float) -> bool:
        return self.poll() is None and self.hearing.check_silence(limit)

    @property
    def silent_for(self) -> float | None:
        return self.hearing.silent_for


class ProcessGroup(RelayedGroup):
    """A group behind a child process of this one: its pipes, its relay threads and its link end.

    A place subclasses it and says how its command line is formed (:meth:`command`); the child runs
    in a session of its own (one process group to signal), with stdin, stdout and stderr piped.
    """

    #: Pipe the child's streams (False: it shares ours, and relays nothing itself).
    piped: ClassVar[bool] = True
    #: Start the child in a session of its own (False: Ctrl-C at a terminal reaches it as it reaches us).
    own_session: ClassVar[bool] = True

    def __init__(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                 reach: Reach | None = None, talks: bool = True, lock: threading.Lock | None = None,
                 on_error_line: Callable[[str], bool] | None = None,
                 out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        super().__init__(host, lock=lock, on_error_line=on_error_line, out=out, err=err)
        command, environment = self.command(list(argv), env, reach or Reach())
        #: The child's command line (what :meth:`command` made of ``argv``).
        self.command_line = command
        pipe = subprocess.PIPE if self.piped else None
        self.proc = subprocess.Popen(command, env=environment, stdin=pipe, stdout=pipe, stderr=pipe,
                                     start_new_session=self.own_session)
        self.link = DriverEnd(self.proc.stdin, talks=talks and self.piped)
        self.hearing = self.link  # the link hears the beats (and learns from them that the child talks)
        self.threads = []
        if self.piped:
            self.threads = [threading.Thread(target=self._relay, args=(self.proc.stdout, False), daemon=True),
                            threading.Thread(target=self._relay, args=(self.proc.stderr, True), daemon=True)]
        for t in self.threads:
            t.start()

    @abstractmethod
    def command(self, argv: list[str], env: Mapping[str, str] | None,
                reach: Reach) -> tuple[list[str], dict[str, str] | None]:
        """The command line that runs ``argv`` on this place, and the environment of that process."""

    # --- output ----------------------------------------------------------------------------------
    def _relay(self, stream: IO[bytes], is_err: bool) -> None:
        held = ""
        for raw in iter(stream.readline, b""):
            held = self._relay_line(raw.decode(errors="replace"), is_err, held)
        if held:
            self._write(held, is_err)

    def join_output(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout=timeout)

    # --- status ----------------------------------------------------------------------------------
    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.time()
        return code

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout=timeout)
        self.poll()
        return code

    # --- liveness --------------------------------------------------------------------------------
    def beat(self) -> None:
        self.link.beat()

    # --- ending ----------------------------------------------------------------------------------
    def stop(self) -> None:
        self.link.stop()

    def forward_signal(self, signum: int) -> bool:
        return self.proc.poll() is None and self.link.forward(signum)

    def request(self, line: bytes) -> bool:
        return self.proc.poll() is None and self.link.talks and self.link.request(line)

    def kill_ranks(self) -> None:
        if not self.link.kill():
            self.kill()  # it does not listen: the process group is all we can reach

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)


class StopSignals:
    """A driver's SIGTERM, SIGINT and SIGHUP while it supervises: the first asks for a stop, another
    one at least :data:`~ringtrain.launch.stopping.REPEAT_AFTER_S` later for killing the ranks at once
    (one sooner is the first delivered twice: ``timeout`` and the terminal both pass Ctrl-C on).

    A context manager; handlers are installed in the main thread only and put back at the end.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: The first signal's number (None until one arrives), and the kill request's.
        self.first: int | None = None
        self.kill: int | None = None
        self._first_at = 0.0
        self._saved: dict[int, Any] = {}

    def on_signal(self, signum: int, _frame: object = None) -> None:
        if self.first is None:
            self.first, self._first_at = signum, self.clock()
        elif self.kill is None and self.clock() - self._first_at >= REPEAT_AFTER_S:
            self.kill = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._saved[sig] = signal.signal(sig, self.on_signal)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()


class Pulse:
    """Heartbeats to a driver's groups every ``interval`` s: call it every tick of the loop."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = 0.0

    def __call__(self, groups: Sequence[RankGroup]) -> None:
        now = time.monotonic()
        if now >= self._next:
            for group in groups:
                group.beat()
            self._next = now + self.interval


def stop_all(groups: Sequence[RankGroup], signals: StopSignals, say: Callable[[str], None],
             where: str = " on every host", grace_s: float = SHUTDOWN_GRACE,
             while_stopping: Callable[[], None] | None = None) -> None:
    """Stop every group and wait for their ends: a second signal kills their ranks at once, and
    anything still running ``grace_s`` after the stop request is killed. ``say`` announces the kill;
    ``while_stopping`` runs every tick (a driver's bookkeeping)."""
    for group in groups:
        group.stop()
    deadline = time.monotonic() + grace_s
    killing = False
    while any(group.poll() is None for group in groups):
        if signals.kill is not None and not killing:
            killing = True
            say(killing_line(signals.kill, where=where))
            for group in groups:
                group.kill_ranks()
        if time.monotonic() > deadline:
            for group in groups:
                group.kill()
        if while_stopping is not None:
            while_stopping()
        time.sleep(TICK)
