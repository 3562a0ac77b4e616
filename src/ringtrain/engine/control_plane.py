"""The control plane: a mesh of plain TCP sockets that carries the engine's negotiation rounds.

Every round is an all-to-all exchange of a few hundred bytes, and small CPU allreduces of the global
set travel here too (see ``executor.mesh_fits``); larger CPU allreduces run as a ring over the same
connections (``socket_ring``, which frames and paces its own transfers). Through gloo such an exchange costs
250-500 us on a small VM, because each message passes through gloo's I/O thread and a condition
variable before the waiting thread sees it. Over a direct socket the waiting thread is woken by the
kernel itself: 10-50 us. Rounds sit on the critical path of every synchronous call and of every
gradient bucket, so this is where latency is won.

:meth:`ControlPlane.allgather` sends only small messages (larger exchanges go elsewhere), and each
peer has at most two messages in flight toward us (it cannot finish an exchange before reading
ours), so sending everything before receiving cannot deadlock as long as the kernel's socket buffers
hold two messages. The ranks agree on a message limit that guarantees this from the buffer sizes
each one got.

A peer that dies closes its sockets, which every other rank sees as end-of-file in the same
round, so a failure surfaces as :class:`ControlPlaneError` at once instead of at a timeout. A peer
that vanishes without closing anything (host down, link cut, process hung) is declared failed by the
heartbeats (:mod:`ringtrain.engine.liveness`), which call :meth:`ControlPlane.abort`: every wait on
the sockets ends with the heartbeats' reason. :meth:`ControlPlane.watch_links` also has the kernel
probe idle connections and give up on unacknowledged rounds (TCP keepalive and
``TCP_USER_TIMEOUT``), for hosts between which the heartbeats' UDP does not pass.

Setup goes through the job's store (:mod:`ringtrain.engine.job_store`, open only to the job's
processes): each rank listens (on loopback when every rank runs on one host, on the interface of
``GLOO_SOCKET_IFNAME`` when one is named, else on every interface), publishes where, dials every
lower rank and accepts every higher one. Every connection proves the job's secret both ways before
anything else crosses it (:mod:`ringtrain.engine.auth`: HMAC over a nonce from each side and the
ranks the connection claims to join), so neither a recorded handshake nor an address an outsider
slipped in gets anybody onto the mesh. Handshakes run side by side in one loop, each with its own
deadline and at most :data:`MAX_PENDING_HANDSHAKES` unproven connections at a time, so idle or slow
strangers cannot hold up setup; they are closed and logged in one line (logger
``ringtrain.security``). The listener closes once the mesh is complete. Authentication happens at
connect time only: the per-round path carries no extra byte.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import selectors
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ringtrain.engine import auth
from ringtrain.engine.netutil import PeerClosedError, candidate_addresses, open_listener, recv_exact
from ringtrain.exceptions import AuthenticationError, ControlPlaneError

#: Upper bound on one message (bytes). The mesh agrees on a smaller limit where the kernel's socket
#: buffers are small (see ``max_message``); larger exchanges go through gloo.
MAX_MESSAGE_BYTES = 256 * 1024
#: Largest world for which a full mesh is built (each rank holds size - 1 sockets).
DEFAULT_MAX_RANKS = 128

#: Seconds one connection gets to complete its handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Unproven incoming connections at once; a new one beyond this closes the oldest.
MAX_PENDING_HANDSHAKES = 64

log = logging.getLogger("ringtrain.security")

_PURPOSE = "control plane v1"
_MAGIC = b"RTCTRL02"
#: What a dialing rank claims: its own rank and the rank it dials.
_CLAIMS = struct.Struct("<II")
_GREETING_BYTES = len(_MAGIC) + auth.NONCE_BYTES
_HELLO_BYTES = len(_MAGIC) + auth.NONCE_BYTES + _CLAIMS.size + auth.PROOF_BYTES
_ACCEPTED, _REFUSED = b"\x01", b"\x00"
_LENGTH = struct.Struct("<Q")
_SOCKET_BUFFER = 4 * 1024 * 1024


def node_identity() -> str:
    """Same value for processes that can reach each other over loopback (same boot, same netns)."""
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            parts.append(boot.read().strip())
    except OSError:
        parts.append(socket.gethostname())
    try:
        parts.append(os.readlink("/proc/self/ns/net"))
    except OSError:
        parts.append("")
    return "/".join(parts)


class ControlPlane:
    """Sockets to every other rank: :meth:`allgather` for rounds and small allreduces, and the
    connections themselves (:meth:`peer_socket`, :meth:`nonblocking`, :meth:`scratch`) for the ring."""

    def __init__(
        self, rank: int, size: int, peers: dict[int, socket.socket], round_timeout_s: float = 3600.0
    ) -> None:
        self.rank, self.size = rank, size
        self._peers = peers
        self._order = sorted(peers)
        self.closed = False
        self.round_timeout_s = round_timeout_s
        #: ``rank N on host H`` by rank, for messages (filled in once the heartbeats know the hosts).
        self.names: dict[int, str] = {}
        #: Why the plane was aborted (a peer declared failed), or None.
        self.failure: str | None = None
        #: TCP_USER_TIMEOUT of the connections outside ring transfers (ms; 0: the kernel's default).
        self._user_timeout_ms = 0
        self._scratch = torch.empty(0, dtype=torch.uint8)
        #: Largest message every rank can buffer twice over (the same value on all ranks).
        self.max_message = MAX_MESSAGE_BYTES
        #: Incoming connections turned away during setup (they did not prove the job's secret).
        self.refused = 0

    @classmethod
    def connect(
        cls,
        store: Any,
        rank: int,
        size: int,
        main_address: str,
        timeout_s: float,
        round_timeout_s: float,
        interfaces: Sequence[str] = (),
        *,
        secret: str | None = None,
        bind_host: str | None = None,
        scope: str = "",
        handshake_timeout_s: float | None = None,
    ) -> ControlPlane:
        """Build the mesh through ``store`` (every rank of the world calls this).

        ``secret``: the job's (None: an unauthenticated job). ``bind_host``: where to listen (None:
        every interface). ``scope``: the generation's namespace; every proof is bound to it.
        ``handshake_timeout_s``: how long one connection may take to prove itself (default
        :data:`HANDSHAKE_TIMEOUT`).
        """
        key = auth.derive_key(secret, _PURPOSE)
        host = bind_host or "0.0.0.0"
        try:
            listener = open_listener(host, 0, backlog=max(size, 128))
        except OSError as exc:
            raise ControlPlaneError(
                f"rank {rank}: cannot listen on {host} for the control plane: {exc}. HINT: check "
                "GLOO_SOCKET_IFNAME, or set RINGTRAIN_CONTROL_PLANE=gloo.") from None
        port = listener.getsockname()[1]
        me = {"node": node_identity(), "port": port, "bound": host,
              "hosts": [host] if host != "0.0.0.0" else candidate_addresses(main_address, interfaces)}
        store.set(f"ctrl/addr/{rank}", json.dumps(me))
        deadline = time.monotonic() + timeout_s
        setup = _MeshSetup(key, scope.encode(), rank, size, listener, deadline, timeout_s,
                           HANDSHAKE_TIMEOUT if handshake_timeout_s is None else handshake_timeout_s)
        try:
            for peer in range(rank):
                info = json.loads(store.get(f"ctrl/addr/{peer}").decode())
                setup.dial(peer, _dial_hosts(info, me["node"]), int(info["port"]))
            peers = setup.run()
        finally:
            listener.close()
        limit = MAX_MESSAGE_BYTES
        for sock in peers.values():
            limit = min(limit, _tune(sock, round_timeout_s))
        plane = cls(rank, size, peers, round_timeout_s)
        plane.refused = setup.refused
        limits = plane.allgather(_LENGTH.pack(limit))
        plane.max_message = min(_LENGTH.unpack(bytes(data))[0] for data in limits)
        return plane

    def allgather(self, data: bytes | memoryview) -> list[bytes | bytearray | memoryview]:
        """Every rank's ``data`` (at most ``max_message`` bytes each), in rank order."""
        if self.closed:
            raise ControlPlaneError("the control plane is closed")
        header = _LENGTH.pack(len(data))
        out: list[bytes | bytearray | memoryview] = [b""] * self.size
        out[self.rank] = data
        peer = -1
        try:
            for peer in self._order:
                self._peers[peer].sendmsg([header, data])
            for peer in self._order:
                out[peer] = self._receive(peer)
        except OSError as exc:
            self.close()
            if self.failure is not None:
                raise ControlPlaneError(self.failure) from None
            if isinstance(exc, ControlPlaneError):
                raise
            raise ControlPlaneError(self.broken_link(peer, exc)) from exc
        return out

    def label(self, peer: int) -> str:
        """``rank N on host H`` (``rank N`` until the hosts are known)."""
        return self.names.get(peer, f"rank {peer}")

    def broken_link(self, peer: int, exc: OSError) -> str:
        """The message for a connection to ``peer`` that failed with ``exc``."""
        unreachable = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH)
        if isinstance(exc, TimeoutError) or exc.errno in unreachable:
            return (f"the connection to {self.label(peer)} timed out ({exc}): its host is unreachable or the "
                    "network to it is cut (its kernel stopped answering)")
        return f"the connection to {self.label(peer)} failed ({exc}): it exited or failed"

    def _receive(self, peer: int) -> bytearray:
        sock = self._peers[peer]
        (length,) = _LENGTH.unpack(self._recv_exact(sock, _LENGTH.size, peer))
        if length > self.max_message:
            raise ControlPlaneError(
                f"{self.label(peer)} sent a {length}-byte control message (protocol error)")
        return self._recv_exact(sock, length, peer)

    def _recv_exact(self, sock: socket.socket, count: int, peer: int) -> bytearray:
        try:
            return recv_exact(sock, count)
        except TimeoutError:
            raise ControlPlaneError(
                f"{self.label(peer)} sent nothing within the round timeout "
                f"(RINGTRAIN_ROUND_TIMEOUT_SECONDS={self.round_timeout_s:g} s) although it did not fail "
                "(its heartbeats arrive and its connection is open): its engine is stuck, e.g. in a long "
                "collective of a process set this rank is not in. HINT: raise "
                "RINGTRAIN_ROUND_TIMEOUT_SECONDS if such waits are expected."
            ) from None
        except PeerClosedError:
            if self.failure is not None:
                raise ControlPlaneError(self.failure) from None
            raise ControlPlaneError(
                f"{self.label(peer)} closed its control connection (it exited or failed)") from None

    def scratch(self, nbytes: int) -> torch.Tensor:
        """A reusable byte buffer for transfers over this plane (kept: a fresh one costs page faults)."""
        if self._scratch.numel() < nbytes:
            self._scratch = torch.empty(nbytes, dtype=torch.uint8)
        return self._scratch[:nbytes]

    def peer_socket(self, peer: int) -> socket.socket:
        """The connection to rank ``peer``, for transfers that frame their own messages (socket_ring)."""
        if self.closed:
            raise ControlPlaneError("the control plane is closed")
        return self._peers[peer]

    @contextlib.contextmanager
    def nonblocking(self, *socks: socket.socket) -> Iterator[float]:
        """Switch ``socks`` to non-blocking calls for a transfer that polls; yields its deadline.

        With a timeout set, Python polls before every send and receive; a transfer that alternates
        between two directions does its own polling instead, only when neither can move.
        """
        for sock in socks:
            sock.setblocking(False)
            if self._user_timeout_ms:
                # A ring transfer may fill a busy peer's buffers (a zero window), which TCP_USER_TIMEOUT
                # would take for a dead link: here only the heartbeats judge the peer.
                _set_user_timeout(sock, 0)
        try:
            yield time.monotonic() + self.round_timeout_s
        except OSError:
            self.close()
            if self.failure is not None:
                raise ControlPlaneError(self.failure) from None
            raise
        finally:
            if not self.closed:
                for sock in socks:
                    sock.settimeout(self.round_timeout_s)
                    if self._user_timeout_ms:
                        _set_user_timeout(sock, self._user_timeout_ms)

    def watch_links(self, peer_timeout_s: float) -> None:
        """Have the kernel end connections whose peer host vanished within about ``peer_timeout_s``.

        Keepalive probes an idle connection after a quarter of the time and gives up after the rest;
        ``TCP_USER_TIMEOUT`` ends one whose sent round stays unacknowledged that long. Rounds are
        small enough that a live peer's kernel always acknowledges them, so neither can mistake a
        busy peer for a dead one (ring transfers, which can fill a busy peer's buffers, lift the
        user timeout while they run).
        """
        idle = max(1, int(peer_timeout_s / 4))
        interval = max(1, int(peer_timeout_s / 8))
        probes = max(1, int(peer_timeout_s) // interval)
        self._user_timeout_ms = int(peer_timeout_s * 1000)
        for sock in self._peers.values():
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
            _set_user_timeout(sock, self._user_timeout_ms)

    def abort(self, reason: str) -> None:
        """A peer was declared failed (by another thread): every wait on the sockets ends with ``reason``.

        The sockets are only shut down here, which wakes a thread blocked on them; the thread that
        uses them closes them.
        """
        if self.failure is None:
            self.failure = reason
        for sock in self._peers.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def gone_peers(self) -> list[int]:
        """Peers whose connection has ended (they exited), seen without consuming any data."""
        gone = []
        for peer, sock in self._peers.items():
            try:
                if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    gone.append(peer)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                gone.append(peer)
        return gone

    def close(self) -> None:
        """Close every connection (peers blocked on us see end-of-file)."""
        self.closed = True
        for sock in self._peers.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _set_user_timeout(sock: socket.socket, milliseconds: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # TCP_USER_TIMEOUT is Linux's
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, milliseconds)


def _tune(sock: socket.socket, timeout_s: float) -> int:
    """Set up a connection; returns the largest message it can hold twice (with room to spare)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Only the send buffer is fixed. A fixed receive buffer turns off the kernel's receive autotuning,
    # and then bulk transfers (the socket ring) overran it: the kernel dropped segments it had no room
    # for, and each drop cost a 200 ms retransmission timeout (seen as 5x slower 64 MiB allreduces,
    # 3 in 55 calls, with RcvQDrop / TCPTimeouts counting up). Autotuned, none in 110 calls.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
    sock.settimeout(timeout_s)
    # The kernel caps the size (net.core.wmem_max) and counts its own overhead in it: a quarter of what
    # both ends hold now is a safe bound for two messages in flight (autotuning only grows them).
    held = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    held += sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    return max(4096, held // 4)


def _dial_hosts(info: dict[str, Any], my_node: str) -> list[str]:
    """Where to reach a peer, most likely first: its bound address, or loopback on the same node."""
    bound = str(info.get("bound", "0.0.0.0"))
    if bound not in ("", "0.0.0.0"):
        return [bound]
    hosts = [str(h) for h in info["hosts"]]
    if info["node"] == my_node:
        hosts.insert(0, "127.0.0.1")
    return hosts


class _Handshake:
    """One connection being set up: ``dialed`` (we dialed ``peer``) or accepted (peer still unknown)."""

    def __init__(self, sock: socket.socket, source: str, deadline: float, peer: int | None = None) -> None:
        self.sock, self.source, self.deadline = sock, source, deadline
        self.peer = peer
        self.dialed = peer is not None
        self.state = "connecting" if self.dialed else "magic"
        self.inbox = bytearray()
        self.need = 0 if self.dialed else len(_MAGIC)
        self.outbox = bytearray()
        self.server_nonce = b""
        self.client_nonce = b""
        self.claims = b""


class _Dial:
    """The attempts to reach one lower rank: its addresses in turn, again after a pause, until done."""

    def __init__(self, peer: int, hosts: list[str], port: int) -> None:
        self.peer, self.hosts, self.port = peer, hosts, port
        self.index = 0
        self.retry_at = 0.0
        self.current: _Handshake | None = None
        self.errors: list[str] = []


class _MeshSetup:
    """Dial every lower rank and accept every higher one, all handshakes side by side in one loop."""

    def __init__(self, key: bytes, scope: bytes, rank: int, size: int, listener: socket.socket,
                 deadline: float, timeout_s: float, handshake_timeout_s: float) -> None:
        self.key, self.scope, self.rank, self.size = key, scope, rank, size
        self.listener, self.deadline, self.timeout_s = listener, deadline, timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.selector = selectors.DefaultSelector()
        self.dials: dict[int, _Dial] = {}
        self.pending: dict[int, _Handshake] = {}  # accepted, unproven; oldest first (by fd)
        self.peers: dict[int, socket.socket] = {}
        self.refused = 0
        self._logged: set[str] = set()

    def dial(self, peer: int, hosts: list[str], port: int) -> None:
        self.dials[peer] = _Dial(peer, hosts, port)

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict[int, socket.socket]:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            while len(self.peers) < self.size - 1:
                now = time.monotonic()
                if now >= self.deadline:
                    raise self._timeout_error()
                for dial in self.dials.values():
                    if dial.current is None and dial.peer not in self.peers and now >= dial.retry_at:
                        self._start_dial(dial)
                waiting = [d for d in self.dials.values() if d.current is None and d.peer not in self.peers]
                wake = [self.deadline, *(d.retry_at for d in waiting)]
                wake += [h.deadline for h in self._handshakes()]
                for key, mask in self.selector.select(max(0.0, min(wake) - now)):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._step(key.data, mask)
                now = time.monotonic()
                for handshake in self._handshakes():
                    if now >= handshake.deadline:
                        self._fail(handshake, f"sent no valid proof within {self.handshake_timeout_s:g} s")
        except BaseException:
            for sock in self.peers.values():
                sock.close()
            raise
        finally:
            for handshake in self._handshakes():
                self._close(handshake)
                if not handshake.dialed:
                    self._refuse(handshake.source, "had proven nothing when the mesh was complete")
            self.selector.close()
        for sock in self.peers.values():
            sock.setblocking(True)
        return self.peers

    def _handshakes(self) -> list[_Handshake]:
        dialing = [d.current for d in self.dials.values() if d.current is not None]
        return [*dialing, *self.pending.values()]

    def _mismatch(self, what: str) -> AuthenticationError:
        """The ranks do not share one secret: no retry can help, so say so at once."""
        return AuthenticationError(
            f"rank {self.rank}: {what}: the ranks of this job do not hold the same secret. HINT: every "
            f"rank needs the same {auth.ENV_SECRET}; ringtrain run sets it, with other launchers export "
            "one value on every rank.")

    def _timeout_error(self) -> Exception:
        missing = sorted(set(range(self.size)) - set(self.peers) - {self.rank})
        unreachable = [f"rank {d.peer}: {d.errors[-1]}" for d in self.dials.values()
                       if d.peer not in self.peers and d.errors]
        detail = f" ({'; '.join(unreachable)})" if unreachable else ""
        return ControlPlaneError(
            f"rank {self.rank}: ranks {missing} did not connect to the control plane within "
            f"{self.timeout_s:g} s{detail}. HINT: check that the hosts reach each other on TCP, set "
            "GLOO_SOCKET_IFNAME to the interface they share, or set RINGTRAIN_CONTROL_PLANE=gloo.")

    # --- dialing ----------------------------------------------------------------------------------
    def _start_dial(self, dial: _Dial) -> None:
        host = dial.hosts[dial.index % len(dial.hosts)]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        handshake = _Handshake(sock, f"{host}:{dial.port}", time.monotonic() + self.handshake_timeout_s,
                               dial.peer)
        dial.current = handshake
        code = sock.connect_ex((host, dial.port))
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._fail(handshake, os.strerror(code))
            return
        self.selector.register(sock, selectors.EVENT_WRITE, handshake)

    def _dial_failed(self, handshake: _Handshake, reason: str) -> None:
        assert handshake.peer is not None  # only a dialed handshake fails its dial
        dial = self.dials[handshake.peer]
        dial.current = None
        dial.errors.append(f"{handshake.source}: {reason}")
        dial.index += 1
        if dial.index % len(dial.hosts) == 0:
            dial.retry_at = time.monotonic() + 0.2  # every address tried: pause before the next round

    # --- accepting --------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            if len(self.pending) >= MAX_PENDING_HANDSHAKES:
                oldest = next(iter(self.pending.values()))
                self._fail(oldest, f"gave way to newer connections ({MAX_PENDING_HANDSHAKES} were unproven)")
            handshake = _Handshake(sock, f"{address[0]}:{address[1]}",
                                   time.monotonic() + self.handshake_timeout_s)
            handshake.server_nonce = auth.new_nonce()
            handshake.outbox += _MAGIC + handshake.server_nonce
            self.pending[sock.fileno()] = handshake
            self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, handshake)

    # --- one connection ---------------------------------------------------------------------------
    def _step(self, handshake: _Handshake, mask: int) -> None:
        try:
            if handshake.state == "connecting":
                if mask & selectors.EVENT_WRITE:
                    code = handshake.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        self._fail(handshake, os.strerror(code))
                        return
                    handshake.state, handshake.need = "greeting", _GREETING_BYTES
                    self.selector.modify(handshake.sock, selectors.EVENT_READ, handshake)
                return
            if mask & selectors.EVENT_WRITE and handshake.outbox:
                sent = handshake.sock.send(handshake.outbox)
                del handshake.outbox[:sent]
            if mask & selectors.EVENT_READ and handshake.need > len(handshake.inbox):
                data = handshake.sock.recv(handshake.need - len(handshake.inbox))
                if not data:
                    self._fail(handshake, "closed the connection during the handshake")
                    return
                handshake.inbox += data
            if handshake.need and len(handshake.inbox) >= handshake.need:
                message = bytes(handshake.inbox)
                handshake.inbox.clear()
                handshake.need = 0
                self._advance(handshake, message)
            if handshake.state == "done" and not handshake.outbox:
                self._finish(handshake)
            elif handshake.state != "closed":
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if handshake.outbox else 0)
                self.selector.modify(handshake.sock, events, handshake)
        except (BlockingIOError, InterruptedError):
            return
        except AuthenticationError:
            raise  # (a ConnectionError, hence an OSError: not a network hiccup to retry)
        except OSError as exc:
            self._fail(handshake, str(exc))

    def _advance(self, handshake: _Handshake, message: bytes) -> None:
        """The next step of the protocol, once ``message`` (exactly the bytes awaited) has arrived."""
        if handshake.state == "magic":  # accepted: is this a ringtrain rank at all?
            if message != _MAGIC:
                self._fail(handshake, "is not a ringtrain control client (wrong greeting)")
                return
            handshake.state, handshake.need = "hello", _HELLO_BYTES - len(_MAGIC)
        elif handshake.state == "hello":  # accepted: the dialer's nonce, claims and proof
            handshake.client_nonce = message[:auth.NONCE_BYTES]
            claims = message[auth.NONCE_BYTES:auth.NONCE_BYTES + _CLAIMS.size]
            claimed = message[auth.NONCE_BYTES + _CLAIMS.size:]
            sender, receiver = _CLAIMS.unpack(claims)
            expected = auth.proof(self.key, b"client", handshake.server_nonce, handshake.client_nonce,
                                  claims + self.scope)
            if not auth.same(claimed, expected):
                self._fail(handshake, "did not prove the job's secret", verdict=_REFUSED)
                return
            if receiver != self.rank or not self.rank < sender < self.size or sender in self.peers:
                self._fail(handshake, f"proved the secret but claimed to be rank {sender} dialing rank "
                                      f"{receiver}, which this rank does not expect", verdict=_REFUSED)
                return
            handshake.peer = sender
            handshake.outbox += _ACCEPTED + auth.proof(self.key, b"server", handshake.server_nonce,
                                                       handshake.client_nonce, claims + self.scope)
            handshake.state = "done"
        elif handshake.state == "greeting":  # dialed: the listener's nonce
            if message[:len(_MAGIC)] != _MAGIC:
                self._fail(handshake, "is not a ringtrain control socket")
                return
            handshake.server_nonce = message[len(_MAGIC):]
            handshake.client_nonce = auth.new_nonce()
            handshake.claims = _CLAIMS.pack(self.rank, handshake.peer) + self.scope
            proof = auth.proof(self.key, b"client", handshake.server_nonce, handshake.client_nonce,
                               handshake.claims)
            handshake.outbox += _MAGIC + handshake.client_nonce + handshake.claims[:_CLAIMS.size] + proof
            handshake.state, handshake.need = "verdict", 1
        elif handshake.state == "verdict":
            if message != _ACCEPTED:
                self._close(handshake)
                raise self._mismatch(f"rank {handshake.peer} at {handshake.source} refused this rank's proof")
            handshake.state, handshake.need = "answer", auth.PROOF_BYTES
        elif handshake.state == "answer":
            expected = auth.proof(self.key, b"server", handshake.server_nonce, handshake.client_nonce,
                                  handshake.claims)
            if not auth.same(message, expected):
                self._close(handshake)
                raise self._mismatch(f"the control socket of rank {handshake.peer} at {handshake.source} "
                                     "could not prove the job's secret")
            handshake.state = "done"

    def _finish(self, handshake: _Handshake) -> None:
        self.selector.unregister(handshake.sock)
        assert handshake.peer is not None
        self.peers[handshake.peer] = handshake.sock
        handshake.state = "proven"
        if handshake.dialed:
            self.dials[handshake.peer].current = None
        else:
            self.pending.pop(handshake.sock.fileno(), None)

    def _fail(self, handshake: _Handshake, reason: str, verdict: bytes = b"") -> None:
        if verdict:
            with contextlib.suppress(OSError):
                handshake.sock.send(verdict)
        self._close(handshake)
        if handshake.dialed:
            self._dial_failed(handshake, reason)
        else:
            self._refuse(handshake.source, reason)

    def _close(self, handshake: _Handshake) -> None:
        if handshake.state == "closed":
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(handshake.sock)
        if not handshake.dialed:
            self.pending.pop(handshake.sock.fileno(), None)
        handshake.sock.close()
        handshake.state = "closed"

    def _refuse(self, source: str, reason: str) -> None:
        self.refused += 1
        host = source.rsplit(":", 1)[0]
        if host not in self._logged:
            self._logged.add(host)
            log.warning("ringtrain control plane (rank %d): closed a connection from %s that %s (further "
                        "refusals from %s are counted, not logged)", self.rank, source, reason, host)
