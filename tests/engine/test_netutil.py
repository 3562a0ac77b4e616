"""The shared socket helpers: exact receive, route and interface addresses, free ports."""

from __future__ import annotations

import socket
import threading

import pytest

from ringtrain.engine import netutil
from ringtrain.exceptions import UsageError


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_recv_exact_gathers_a_message_sent_in_pieces(pair):
    a, b = pair
    sent = threading.Event()

    def send() -> None:
        for piece in (b"ab", b"cde", b"fgh"):
            a.sendall(piece)
        sent.set()

    sender = threading.Thread(target=send)
    sender.start()
    assert netutil.recv_exact(b, 5) == bytearray(b"abcde")
    assert netutil.recv_exact(b, 3) == bytearray(b"fgh")
    sender.join(30)
    assert sent.is_set()


def test_recv_exact_of_nothing_reads_nothing(pair):
    assert netutil.recv_exact(pair[1], 0) == bytearray()


def test_a_peer_that_closes_early_is_named(pair):
    a, b = pair
    a.sendall(b"xy")
    a.close()
    with pytest.raises(netutil.PeerClosedError, match="closed the connection"):
        netutil.recv_exact(b, 4)
    assert issubclass(netutil.PeerClosedError, ConnectionResetError)  # what the job store's callers catch


def test_a_timeout_passes_through_for_the_caller_to_name_the_peer(pair):
    pair[1].settimeout(0.01)
    with pytest.raises(TimeoutError):
        netutil.recv_exact(pair[1], 1)


def test_route_address():
    assert netutil.route_address("127.0.0.1") == "127.0.0.1"
    assert netutil.route_address("no-such-host.invalid") is None


def test_candidate_addresses_include_the_route_to_the_store():
    assert "127.0.0.1" in netutil.candidate_addresses("127.0.0.1")


def test_interfaces_include_loopback():
    assert ("lo", "127.0.0.1") in netutil.interface_addresses()
    assert netutil.interface_address("lo") == "127.0.0.1"
    assert netutil.interface_address("nosuch0") is None


def test_free_port_is_free_and_a_taken_one_is_refused():
    port = netutil.free_port()
    netutil.check_port_free(port)
    with socket.socket() as holder:
        holder.bind(("", port))
        holder.listen(1)
        with pytest.raises(UsageError, match=rf"master port {port} is already in use.*HINT"):
            netutil.check_port_free(port)


def test_free_ports_come_from_below_the_kernels_own_range():
    # The kernel hands ephemeral ports to every outgoing connection: one of those could take a port
    # picked there before the rank that is to listen on it gets to bind it (seen under load).
    low, high = netutil.ephemeral_port_range()
    assert 0 < low < high
    for _ in range(20):
        assert netutil.PORT_FLOOR <= netutil.free_port() < low


def test_free_port_skips_ports_held_or_to_avoid(monkeypatch):
    taken = netutil.free_port()
    ports = iter([taken, taken + 1, taken + 2])
    monkeypatch.setattr(netutil.random.SystemRandom, "randrange", lambda self, a, b: next(ports))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen(1)
        assert netutil.free_port(avoid={taken + 1}) == taken + 2


def test_free_port_lets_the_kernel_pick_where_no_room_is_left_below_its_range(monkeypatch):
    monkeypatch.setattr(netutil, "ephemeral_port_range", lambda: (netutil.PORT_FLOOR + 10, 65000))
    port = netutil.free_port()
    assert port >= netutil.PORT_FLOOR + 10
    netutil.check_port_free(port)


def test_a_port_a_finished_job_left_in_time_wait_counts_as_free():
    # The side that closes first keeps the port in TIME_WAIT for a minute; the next job on that
    # port (a test suite reusing one port, a restarted job) must not be refused for it.
    listener = netutil.open_listener("127.0.0.1")
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()
    listener.close()
    assert client.recv(1) == b""
    client.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("", port))  # what a probe without SO_REUSEADDR saw
    netutil.check_port_free(port)
    netutil.open_listener("", port).close()


def test_recv_into_exact_fills_a_view_of_an_existing_buffer(pair):
    a, b = pair
    target = bytearray(b"......")
    a.sendall(b"abc")
    a.sendall(b"def")
    netutil.recv_into_exact(b, memoryview(target)[1:5])
    assert target == bytearray(b".abcd.")
    a.close()
    with pytest.raises(netutil.PeerClosedError):
        netutil.recv_into_exact(b, memoryview(target)[:3])  # "ef" is there, then the close
    assert target == bytearray(b"efbcd.")


def test_open_listener_listens_and_a_taken_port_is_refused_without_a_leak():
    with netutil.open_listener("127.0.0.1") as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30):
            pass
        with pytest.raises(OSError):
            netutil.open_listener("127.0.0.1", port)
