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

Setup goes through the job's store: rank 0 publishes a random token, each rank publishes where it
listens, connects to every lower rank and accepts every higher one. A connection is accepted only
with the job's token and a rank that is still missing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ringtrain.exceptions import ControlPlaneError

#: Upper bound on one message (bytes). The mesh agrees on a smaller limit where the kernel's socket
#: buffers are small (see ``max_message``); larger exchanges go through gloo.
MAX_MESSAGE_BYTES = 256 * 1024
#: Largest world for which a full mesh is built (each rank holds size - 1 sockets).
DEFAULT_MAX_RANKS = 128

_MAGIC = b"RTCTRL01"
_HELLO = struct.Struct("<8s32sI")
_LENGTH = struct.Struct("<Q")
_SOCKET_BUFFER = 4 * 1024 * 1024
_SIOCGIFADDR = 0x8915


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


def _interface_address(name: str) -> str | None:
    """IPv4 address of network interface ``name`` (Linux), or None."""
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def _route_address(target: str) -> str | None:
    """The local IPv4 address the kernel would use to reach ``target`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def candidate_addresses(main_address: str, interfaces: Sequence[str] = ()) -> list[str]:
    """Where peers on other nodes may reach this process, most likely first (``interfaces``: those of
    ``GLOO_SOCKET_IFNAME``)."""
    found: list[str | None] = []
    for name in interfaces:
        found.append(_interface_address(name))
    if main_address:
        found.append(_route_address(main_address))
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM):
            found.append(str(info[4][0]))
    out: list[str] = []
    for address in found:
        if address and address not in out:
            out.append(address)
    return out


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
    ) -> ControlPlane:
        """Build the mesh through ``store`` (every rank of the world calls this)."""
        if rank == 0:
            store.set("ctrl/token", secrets.token_hex(16))
        token = store.get("ctrl/token").decode()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen(max(size, 16))
        port = listener.getsockname()[1]
        me = {"node": node_identity(), "port": port, "hosts": candidate_addresses(main_address, interfaces)}
        store.set(f"ctrl/addr/{rank}", json.dumps(me))
        peers: dict[int, socket.socket] = {}
        deadline = time.monotonic() + timeout_s
        try:
            for peer in range(rank):
                info = json.loads(store.get(f"ctrl/addr/{peer}").decode())
                sock = _dial(info, me["node"], peer, deadline)
                sock.sendall(_HELLO.pack(_MAGIC, token.encode(), rank))
                peers[peer] = sock
            while len(peers) < size - 1:
                listener.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    missing = sorted(set(range(size)) - set(peers) - {rank})
                    raise ControlPlaneError(
                        f"rank {rank}: ranks {missing} did not connect to the control plane within "
                        f"{timeout_s:g} s. HINT: check that the hosts reach each other on TCP, set "
                        "GLOO_SOCKET_IFNAME to the interface they share, or set "
                        "RINGTRAIN_CONTROL_PLANE=gloo."
                    ) from None
                sender = _read_hello(sock, token, rank, size, set(peers))
                if sender is None:
                    sock.close()
                    continue
                peers[sender] = sock
        except BaseException:
            for sock in peers.values():
                sock.close()
            raise
        finally:
            listener.close()
        limit = MAX_MESSAGE_BYTES
        for sock in peers.values():
            limit = min(limit, _tune(sock, round_timeout_s))
        plane = cls(rank, size, peers, round_timeout_s)
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
        buffer = bytearray(count)
        view = memoryview(buffer)
        got = 0
        while got < count:
            try:
                n = sock.recv_into(view[got:], count - got)
            except TimeoutError:
                raise ControlPlaneError(
                    f"{self.label(peer)} sent nothing within the round timeout "
                    f"(RINGTRAIN_ROUND_TIMEOUT_SECONDS={self.round_timeout_s:g} s) although it did not fail "
                    "(its heartbeats arrive and its connection is open): its engine is stuck, e.g. in a long "
                    "collective of a process set this rank is not in. HINT: raise "
                    "RINGTRAIN_ROUND_TIMEOUT_SECONDS if such waits are expected."
                ) from None
            if n == 0:
                if self.failure is not None:
                    raise ControlPlaneError(self.failure)
                raise ControlPlaneError(
                    f"{self.label(peer)} closed its control connection (it exited or failed)")
            got += n
        return buffer

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


def _recv_exact(sock: socket.socket, count: int, peer: int) -> bytearray:
    buffer = bytearray(count)
    view = memoryview(buffer)
    got = 0
    while got < count:
        try:
            n = sock.recv_into(view[got:], count - got)
        except TimeoutError:
            raise ControlPlaneError(
                f"rank {peer} sent nothing within the round timeout (RINGTRAIN_ROUND_TIMEOUT_SECONDS)"
            ) from None
        if n == 0:
            raise ControlPlaneError(f"rank {peer} closed its control connection (it exited or failed)")
        got += n
    return buffer


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


def _dial(info: dict[str, Any], my_node: str, peer: int, deadline: float) -> socket.socket:
    hosts = list(info["hosts"])
    if info["node"] == my_node:
        hosts.insert(0, "127.0.0.1")
    errors = []
    while True:
        for host in hosts:
            try:
                return socket.create_connection((host, info["port"]), timeout=5.0)
            except OSError as exc:
                errors.append(f"{host}:{info['port']}: {exc}")
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"cannot reach rank {peer}'s control socket ({'; '.join(errors[-len(hosts):])}). "
                "HINT: set GLOO_SOCKET_IFNAME to the interface the hosts share, or set "
                "RINGTRAIN_CONTROL_PLANE=gloo."
            )
        time.sleep(0.2)


def _read_hello(sock: socket.socket, token: str, rank: int, size: int, have: set[int]) -> int | None:
    """The sender's rank, or None for a connection that is not one of ours."""
    sock.settimeout(10.0)
    try:
        magic, their_token, sender = _HELLO.unpack(_recv_exact(sock, _HELLO.size, -1))
    except (OSError, struct.error):
        return None
    if magic != _MAGIC or their_token != token.encode():
        return None
    if not rank < sender < size or sender in have:
        return None
    return int(sender)
