"""Small socket helpers every part of the package shares: exact receive, route choice, free ports.

One home for them, so that the job store, the control plane and the launcher agree on what "the
peer closed the connection" and "the address that reaches that host" mean.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
from collections.abc import Collection, Sequence

from ringtrain.exceptions import UsageError

__all__ = ["PeerClosedError", "candidate_addresses", "check_port_free", "ephemeral_port_range", "free_port",
           "interface_address", "interface_addresses", "open_listener", "recv_exact", "recv_into_exact",
           "route_address"]

#: Linux's ioctl that reads an interface's IPv4 address.
_SIOCGIFADDR = 0x8915


class PeerClosedError(ConnectionResetError):
    """The other side closed the connection before everything expected arrived."""


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` (a writable byte view, e.g. of a tensor) from a blocking ``sock``, all of it.

    Raises :class:`PeerClosedError` when the peer closes first; a socket timeout (``TimeoutError``) and
    other ``OSError`` pass through, for the caller to name the peer.
    """
    while len(view):
        got = sock.recv_into(view)
        if got == 0:
            raise PeerClosedError("the other side closed the connection")
        view = view[got:]


def recv_exact(sock: socket.socket, count: int) -> bytearray:
    """Exactly ``count`` bytes from ``sock`` in a new buffer (errors as :func:`recv_into_exact`)."""
    buffer = bytearray(count)
    recv_into_exact(sock, memoryview(buffer))
    return buffer


def route_address(target: str) -> str | None:
    """The local IPv4 address the kernel would use to reach ``target`` (a name or an address; no packet
    is sent), or None when there is no route or the name does not resolve."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # a datagram socket's connect only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return None


def interface_address(name: str) -> str | None:
    """IPv4 address of network interface ``name`` (Linux), or None."""
    try:
        import fcntl  # Linux and other Unix systems

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def interface_addresses() -> tuple[tuple[str, str], ...]:
    """``(name, IPv4 address)`` of this host's interfaces (Linux ioctl; "" where one has no IPv4)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return ()
    return tuple((name, interface_address(name) or "") for name in names)


def candidate_addresses(main_address: str, interfaces: Sequence[str] = ()) -> list[str]:
    """Where peers on other nodes may reach this process, most likely first (``interfaces``: those of
    ``GLOO_SOCKET_IFNAME``)."""
    found: list[str | None] = []
    for name in interfaces:
        found.append(interface_address(name))
    if main_address:
        found.append(route_address(main_address))
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM):
            found.append(str(info[4][0]))
    out: list[str] = []
    for address in found:
        if address and address not in out:
            out.append(address)
    return out


def open_listener(host: str, port: int = 0, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on ``(host, port)`` (IPv6 when ``host`` has a ``:``); closed again when it
    cannot bind or listen, so the caller only words the error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restarted job takes its port again at once instead of waiting out TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    return listener


#: The lowest port :func:`free_port` picks: above the registered services most hosts run.
PORT_FLOOR = 20000
#: Where Linux says which ports it hands out by itself (to ``bind(port 0)`` and outgoing connections).
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out on its own (Linux's default where the file cannot be read)."""
    try:
        with open(_EPHEMERAL_RANGE_FILE) as fp:
            low, high = (int(part) for part in fp.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A TCP port nobody holds right now, for a listener that another process opens seconds later.

    It is picked at random below the kernel's ephemeral range, not with ``bind(port 0)``. The kernel
    hands ephemeral ports to every outgoing connection on the machine too, and the listener comes
    late (a rank imports torch first): in that gap any connection could take the port, and the rank
    then fails with "address already in use". A port below the range is only ever taken by a process
    that binds it on purpose. ``avoid``: ports not to hand out (e.g. those of earlier attempts). Where
    the range leaves no room below it, the kernel picks.
    """
    low, _ = ephemeral_port_range()
    rng = random.SystemRandom()
    if low - PORT_FLOOR >= 1000:
        for _ in range(64):
            port = rng.randrange(PORT_FLOOR, low)
            if port in avoid:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            return port
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
    raise OSError(f"no free TCP port on {host} outside {sorted(avoid)[:5]}... HINT: free some ports.")


def check_port_free(port: int, host: str = "") -> None:
    """Error out early, with the port in the message, when the rendezvous port is taken.

    The probe binds the way ``open_listener`` will (SO_REUSEADDR), so the connections a finished job
    left in TIME_WAIT on the port do not count as taken: only a live listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise UsageError(f"master port {port} is already in use on this host. HINT: pick another "
                             "with --master-port, or leave it out to use a free port.") from None
