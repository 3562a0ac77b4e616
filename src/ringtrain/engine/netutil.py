"""Small socket helpers every part of the package shares: exact receive, route choice, free ports.

One home for them, so that the job store, the control plane and the launcher agree on what "the
peer closed the connection" and "the address that reaches that host" mean.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Sequence

from ringtrain.exceptions import UsageError

__all__ = ["PeerClosedError", "candidate_addresses", "check_port_free", "free_port", "interface_address",
           "interface_addresses", "open_listener", "recv_exact", "recv_into_exact", "route_address"]

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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
