"""Liveness: heartbeats between the ranks, and bounded waits once a peer is declared failed.

A rank that dies closes its sockets and the others see end-of-file at once. A peer whose host went
down, whose link was cut, or whose process hangs (stopped, deadlocked) closes nothing: a wait on it
would last until the kernel gives up retransmitting (about 16 minutes with ``tcp_retries2=15``) or a
gloo timeout. The kernel alone cannot tell such a peer from one that is alive but busy (measured on
Linux 6.x between two network namespaces, see docs/failures.md):

- TCP keepalive (``TCP_KEEPIDLE/INTVL/CNT``) ends an *idle* connection to a vanished host quickly,
  but it is silent while sent data waits for an acknowledgement, which is the usual state after a
  cut: each rank sends its next round and then waits.
- ``TCP_USER_TIMEOUT`` ends a connection whose sent data is unacknowledged for that long, but also
  one whose peer is alive and simply not reading (a zero window): a rank busy in a long collective of
  another process set would be declared dead.
- Neither notices a process that is stopped or hung: its kernel keeps acknowledging.

So each rank runs a small thread that sends a UDP heartbeat to its peers every second (at most a
quarter of ``RINGTRAIN_PEER_TIMEOUT_SECONDS``) and watches theirs. The thread needs nothing from the
engine thread or the user's code (torch releases the GIL while it computes), so a rank that
computes, evaluates, checkpoints or waits in a collective keeps beating; one that is killed, stopped
or cut off does not. When a peer has been silent for the timeout, the watcher declares it failed:
it tells every other rank (a one-off FAIL datagram), and the engine aborts its waits (see
:class:`Abort`) so that every waiting call raises ``HorovodInternalError`` naming the silent rank
and its host.

A peer from which no heartbeat ever arrived (UDP filtered between the hosts) is not judged: a
warning says so, and such peers are left to TCP (keepalive on the control plane) and gloo's timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import hashlib
import hmac
import json
import logging
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ringtrain.engine import auth
from ringtrain.exceptions import ControlPlaneError

log = logging.getLogger("ringtrain.engine")

#: Longest pause between two heartbeats of a rank.
MAX_INTERVAL_S = 1.0
#: Worlds up to this size watch every peer and read every peer's record; larger ones watch their ring
#: neighbours only and read the records of the ranks at distance 1, 2, 4, ... on the ring, which a FAIL
#: notice is forwarded to: it reaches everyone in log2(N) hops, and a rank's start-up reads 2 log2(N)
#: records in one request instead of N records in N (N² in the job).
FULL_WATCH_RANKS = 64
#: How often a thread blocked on gloo work checks whether the job has failed.
WAIT_SLICE = datetime.timedelta(seconds=0.5)
#: A gloo operation waiting this long on live peers says so (once), instead of waiting in silence.
LONG_WAIT_S = 60.0

_MAGIC = b"RTHB"
_DATAGRAM = struct.Struct("<4s16sBII")
_BEAT, _BYE, _FAIL = 0, 1, 2
#: A FAIL notice carries, after the datagram, the rank that noticed and both ranks' descriptions (a
#: forwarded notice reaches ranks that never read the failed rank's record).
_NOTE = struct.Struct("<I")
_NOTE_TEXT_BYTES = 400
_RECEIVE_BUFFER = 1024 * 1024


class Abort:
    """Set once a peer has failed: every wait of the engine ends with :class:`ControlPlaneError`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def trigger(self, reason: str) -> bool:
        """Record ``reason`` (the first one wins); True when this call triggered it."""
        if self._event.is_set():
            return False
        self.reason = reason
        self._event.set()
        return True

    @property
    def triggered(self) -> bool:
        return self._event.is_set()


#: The abort of the running engine (one per process); waits outside an engine object use it.
current = Abort()
#: Process groups left with work stuck on a failed peer: never destroyed (see :func:`abandon`).
_abandoned: list[Any] = []


def wait_work(work: Any, abort: Abort | None = None, what: str = "a gloo operation") -> None:
    """``work.wait()`` that gives up once ``abort`` (default: the engine's) is triggered.

    Gloo's wait takes a timeout but, unlike gloo's own timeout, an expired wait leaves the work
    running: waiting in slices costs nothing while the work moves and lets the caller leave as soon
    as a peer is declared failed.
    """
    abort = abort or current
    started = time.monotonic()
    warned = False
    while True:
        try:
            work.wait(WAIT_SLICE)
            return
        except RuntimeError:
            if work.is_completed():
                # Either the work itself failed (a peer closed its connection, gloo's timeout), or it
                # completed just after the slice expired (a peer arriving at the slice's end): waiting
                # once more returns at once in the second case and raises the work's own error in the first.
                work.wait(WAIT_SLICE)
                return
            if abort.triggered:
                raise ControlPlaneError(f"{what} was abandoned: {abort.reason}") from None
            # only this slice expired: the work goes on
            if not warned and time.monotonic() - started > LONG_WAIT_S:
                warned = True
                log.warning("%s has waited %.0f s for its peers, which are alive (their heartbeats "
                            "arrive); it fails at HOROVOD_GLOO_TIMEOUT_SECONDS", what,
                            time.monotonic() - started)


def wait_on_group(work: Any, process_group: Any, abort: Abort | None = None) -> None:
    """:func:`wait_work` on work of ``process_group``; a group whose work was given up is abandoned."""
    try:
        wait_work(work, abort)
    except ControlPlaneError:
        abandon(process_group)
        raise


def abandon(process_group: Any) -> None:
    """Never destroy ``process_group``: its worker thread is stuck on a failed peer.

    Gloo's destructor joins its worker threads, and a thread blocked on a peer that vanished leaves
    only at gloo's timeout: destroying the group (at ``shutdown()`` or at interpreter exit) would
    hang that long. An extra reference held from C is never released, so the process exits at once
    and the operating system reclaims the group.
    """
    if process_group is None or any(process_group is held for held in _abandoned):
        return
    _abandoned.append(process_group)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(process_group))


def wait_for_keys(store: Any, keys: Sequence[str], timeout_s: float, waiting_for: Callable[[list[str]], str],
                  rank: int) -> None:
    """Wait until ``keys`` exist in ``store``, saying every 10 s who is still missing; raise after
    ``timeout_s`` (``HOROVOD_GLOO_TIMEOUT_SECONDS``) naming them."""
    deadline = time.monotonic() + timeout_s
    step = 10.0
    while True:
        # One request waits for all of them; only a slow start asks key by key who is missing.
        left = deadline - time.monotonic()
        try:
            store.wait(list(keys), datetime.timedelta(seconds=max(0.001, min(step, left))))
            return
        except Exception:  # the store's timeout error; a lost store raises again below
            missing = [key for key in keys if not store.check([key])]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise ControlPlaneError(
                f"rank {rank}: {waiting_for(missing)} did not join within HOROVOD_GLOO_TIMEOUT_SECONDS="
                f"{timeout_s:g} s. HINT: check that every rank started (the launcher's output says why "
                "one did not), or raise HOROVOD_GLOO_TIMEOUT_SECONDS for slow starts.")
        log.warning("rank %d: still waiting for %s (%.0f s left of HOROVOD_GLOO_TIMEOUT_SECONDS)",
                    rank, waiting_for(missing), max(0.0, deadline - time.monotonic()))


def read_keys(store: Any, keys: Sequence[str]) -> list[bytes]:
    """The values of ``keys`` (which exist) in one request where the store has ``multi_get``."""
    try:
        return list(store.multi_get(list(keys)))
    except (AttributeError, NotImplementedError, RuntimeError):  # a store without multi_get
        return [store.get(key) for key in keys]


def job_nonce(published: bytes, secret: str | None, scope: str) -> bytes:
    """The value every heartbeat datagram of this generation carries (peers drop any other).

    In a job with a secret it is an HMAC of rank 0's published random value and the generation under
    a key derived from the secret, so a process outside the job cannot compute it even if it could
    read the store, and cannot forge a beat or a FAIL notice (one that records the job's datagrams on
    the wire can still replay them: see docs/security.md). Without a secret it is the published value.
    """
    if secret is None:
        return published
    key = auth.derive_key(secret, "heartbeat v1")
    return hmac.new(key, scope.encode() + b"|" + published, hashlib.sha256).digest()[:len(published)]


def contacted_peers(rank: int, size: int) -> list[int]:
    """The ranks whose records this rank reads and which its FAIL notices go to: all in small worlds,
    those at distance 1, 2, 4, ... either way round the ring in large ones (the watched ones among them)."""
    if size <= FULL_WATCH_RANKS:
        return [r for r in range(size) if r != rank]
    found: set[int] = set()
    distance = 1
    while distance < size:
        found.update(((rank + distance) % size, (rank - distance) % size))
        distance *= 2
    found.discard(rank)
    return sorted(found)


def watched_peers(rank: int, size: int) -> list[int]:
    """The ranks this rank watches (and beats to): all in small worlds, ring neighbours in large ones."""
    if size <= FULL_WATCH_RANKS:
        return [r for r in range(size) if r != rank]
    return sorted({(rank + d) % size for d in (-2, -1, 1, 2)} - {rank})


class Heartbeats:
    """The heartbeat thread of one rank: beats to its peers, watches theirs, reports a silent one.

    ``on_failure(reason)`` runs on the heartbeat thread, once, when a watched peer has been silent
    for ``timeout_s`` or another rank reports one; ``names`` maps every rank to ``rank N on host H``.
    """

    def __init__(self, sock: socket.socket, nonce: bytes, rank: int, size: int, hostname: str,
                 names: dict[int, str], targets: dict[int, list[tuple[str, int]]], timeout_s: float,
                 on_failure: Callable[[str], None]) -> None:
        self._sock, self._nonce = sock, nonce
        self.rank, self.size, self.hostname = rank, size, hostname
        self.names = names
        self._targets = targets
        self.timeout_s = timeout_s
        self.interval_s = min(MAX_INTERVAL_S, timeout_s / 4)
        self._on_failure = on_failure
        self._watched = set(watched_peers(rank, size)) & set(targets)
        start = time.monotonic()
        #: When each watched peer was last heard from (its first beat counts from our start).
        self._heard: dict[int, float | None] = dict.fromkeys(self._watched)
        self._started = start
        self._failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ringtrain-heartbeat", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ setup
    @classmethod
    def start(cls, store: Any, rank: int, size: int, hostname: str, node: str, addresses: Sequence[str],
              peer_address: Callable[[int], str | None], timeout_s: float, setup_timeout_s: float,
              on_failure: Callable[[str], None], secret: str | None = None, scope: str = "") -> Heartbeats:
        """Publish this rank's heartbeat port through ``store`` and start beating (every rank calls this).

        ``peer_address(r)`` is the address that already reaches rank ``r`` (the control plane's
        connection), or None: then every address rank ``r`` published is tried. ``secret`` (the job's)
        and ``scope`` (the generation's namespace) make the value every datagram carries (see
        :func:`job_nonce`).
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
            sock.bind(("0.0.0.0", 0))
            sock.setblocking(False)
            if rank == 0:
                store.set("live/nonce", secrets.token_hex(16))
            me = {"host": hostname, "node": node, "port": sock.getsockname()[1], "addrs": list(addresses)}
            store.set(f"live/{rank}", json.dumps(me))
            contacted = contacted_peers(rank, size)
            keys = ["live/nonce", *(f"live/{r}" for r in contacted)]

            def waiting_for(missing: list[str]) -> str:
                ranks = [key.split("/")[1] for key in missing if key != "live/nonce"]
                return f"ranks {', '.join(ranks)}" if ranks else "rank 0"

            wait_for_keys(store, keys, setup_timeout_s, waiting_for, rank)
            values = read_keys(store, keys)
            nonce = job_nonce(bytes.fromhex(values[0].decode()), secret, scope)
            names: dict[int, str] = {rank: f"rank {rank} on host {hostname}"}
            targets: dict[int, list[tuple[str, int]]] = {}
            for peer, raw in zip(contacted, values[1:]):
                info = json.loads(raw.decode())
                names[peer] = f"rank {peer} on host {info['host']}"
                known = peer_address(peer)
                if known is not None:
                    hosts = [known]
                elif info["node"] == node:
                    hosts = ["127.0.0.1"]
                else:
                    hosts = list(info["addrs"])
                targets[peer] = [(host, int(info["port"])) for host in hosts]
        except BaseException:
            sock.close()
            raise
        return cls(sock, nonce, rank, size, hostname, names, targets, timeout_s, on_failure)

    def describe(self, rank: int) -> str:
        """``rank N on host H``."""
        return self.names.get(rank, f"rank {rank}")

    # ------------------------------------------------------------------ thread
    def stop(self) -> None:
        """Say goodbye to the peers (so they do not take our silence for a failure) and stop.

        Returns at once: the thread leaves within one heartbeat interval and closes the socket (a
        beat it sends after the goodbye is ignored by the peers).
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._send_all(_BYE, self.rank)

    def _run(self) -> None:
        next_beat = time.monotonic()
        last_loop = next_beat
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now - last_loop > max(3 * self.interval_s, self.timeout_s / 2):
                    # This thread itself did not run for a while (an overloaded machine): what the
                    # peers sent meanwhile may be lost, so nobody is judged on that gap.
                    self._heard = {p: (None if seen is None else now) for p, seen in self._heard.items()}
                    self._started = now
                last_loop = now
                if now >= next_beat:
                    self._send_all(_BEAT, self.rank)
                    next_beat = now + self.interval_s
                self._receive()
                if not self._failed:
                    self._check(time.monotonic())
                with contextlib.suppress(OSError, ValueError):
                    select.select([self._sock], [], [], max(0.0, next_beat - time.monotonic()))
        except Exception:  # a broken watcher must not take the rank down
            log.debug("heartbeat thread failed", exc_info=True)
        finally:
            self._sock.close()

    def _send_all(self, kind: int, subject: int, note: bytes = b"") -> None:
        datagram = _DATAGRAM.pack(_MAGIC, self._nonce, kind, self.rank, subject) + note
        peers = self._targets if kind == _FAIL else {p: self._targets[p] for p in self._watched}
        for addresses in peers.values():
            for address in addresses:
                # a down link, an unreachable host: that peer's watcher will notice our silence
                with contextlib.suppress(OSError):
                    self._sock.sendto(datagram, address)

    def _receive(self) -> None:
        while True:
            try:
                data = self._sock.recv(1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(data) < _DATAGRAM.size:
                continue
            magic, nonce, kind, sender, subject = _DATAGRAM.unpack_from(data)
            if magic != _MAGIC or nonce != self._nonce or not 0 <= sender < self.size or sender == self.rank:
                continue
            if kind == _BEAT and sender in self._heard:
                self._heard[sender] = time.monotonic()
            elif kind == _BYE:
                self._heard.pop(sender, None)
            elif kind == _FAIL and 0 <= subject < self.size and subject != self.rank and not self._failed:
                failed, noticed = self._read_note(data, sender, subject)
                if self.size > FULL_WATCH_RANKS:
                    # Pass it on once (this rank fails now, and a failed rank forwards nothing more):
                    # the notice floods the distance-2^k links and reaches every rank.
                    self._send_all(_FAIL, subject, data[_DATAGRAM.size:])
                self._fail(f"{failed} has failed: {noticed} heard no heartbeat from it for "
                           f"{self.timeout_s:g} s (RINGTRAIN_PEER_TIMEOUT_SECONDS); its process was killed "
                           "or hung, its host went down, or the network to it was cut")

    def _check(self, now: float) -> None:
        for peer, seen in list(self._heard.items()):
            if seen is None:
                if now - self._started > self.timeout_s:
                    log.warning(
                        "rank %d: no heartbeat ever arrived from %s (UDP to %s filtered?): a hang of that "
                        "rank or a cut link to it is noticed only by TCP and gloo timeouts", self.rank,
                        self.describe(peer), ", ".join(f"{h}:{p}" for h, p in self._targets.get(peer, [])))
                    del self._heard[peer]
                continue
            silent = now - seen
            if silent > self.timeout_s:
                self._send_all(_FAIL, peer, self._note(peer))
                self._fail(f"{self.describe(peer)} has given no sign of life for {silent:.0f} s "
                           f"(RINGTRAIN_PEER_TIMEOUT_SECONDS={self.timeout_s:g}): its process was killed or "
                           f"hung, its host went down, or the network between {self.hostname} and it was cut")
                return

    def _note(self, subject: int) -> bytes:
        """What a FAIL notice about ``subject`` carries after the datagram: who noticed, both named."""
        text = f"{self.describe(subject)}\n{self.describe(self.rank)}".encode()[:_NOTE_TEXT_BYTES]
        return _NOTE.pack(self.rank) + text

    def _read_note(self, data: bytes, sender: int, subject: int) -> tuple[str, str]:
        """The failed rank's and the noticing rank's descriptions from a FAIL notice."""
        note = data[_DATAGRAM.size:]
        if len(note) < _NOTE.size:  # a notice without one: the sender noticed
            return self.describe(subject), self.describe(sender)
        (noticed,) = _NOTE.unpack_from(note)
        failed_name, _, noticed_name = note[_NOTE.size:].decode(errors="replace").partition("\n")
        return (self.names.get(subject) or failed_name or f"rank {subject}",
                self.names.get(noticed) or noticed_name or f"rank {noticed}")

    def _fail(self, reason: str) -> None:
        self._failed = True
        self._on_failure(reason)
