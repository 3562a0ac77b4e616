"""The job store (engine/job_store.py): torch's Store semantics, and nobody without the secret gets in."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from ringtrain.engine import auth, job_store
from ringtrain.exceptions import AuthenticationError, JobStoreError, SettingError
from tests.ranks import free_port

SECRET = "a" * 64


@pytest.fixture
def server() -> Iterator[job_store.JobStoreServer]:
    with job_store.JobStoreServer(SECRET) as srv:
        yield srv


@pytest.fixture
def store(server: job_store.JobStoreServer) -> Iterator[job_store.JobStore]:
    client = job_store.JobStore(server.address, SECRET, timeout=30.0)
    yield client
    client.close()


def _still_open(sock: socket.socket) -> bool:
    """True while the other side has not closed ``sock`` (what it sent, such as a greeting, is read)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False  # end of file
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def _wait_closed(sock: socket.socket, guard_s: float = 60.0) -> bool:
    """Block until the other side closes ``sock``: True, or False when the hang guard expires."""
    sock.settimeout(guard_s)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# ------------------------------------------------------------------------------------ semantics
def test_set_get_add_check_delete_and_count(store):
    store.set("a", "1")
    store.set("b", b"\x00\xff")
    assert store.get("a") == b"1"
    assert store.get("b") == b"\x00\xff"
    assert store.add("n", 2) == 2
    assert store.add("n", -5) == -3
    assert store.get("n") == b"-3"
    assert store.check(["a", "b"])
    assert not store.check(["a", "missing"])
    assert store.num_keys() == 3
    assert store.delete_key("a")
    assert not store.delete_key("a")
    assert not store.check(["a"])


def test_compare_set_follows_torch(store):
    assert store.compare_set("k", "", "first") == b"first"  # a missing key counts as empty
    assert store.compare_set("k", "wrong", "x") == b"first"  # mismatch: the current value
    assert store.compare_set("k", "first", "second") == b"second"
    assert store.compare_set("absent", "expected", "x") == b"expected"
    assert not store.check(["absent"])


def test_multi_get_multi_set_append(store):
    store.multi_set(["x", "y"], ["1", b"2"])
    assert store.multi_get(["x", "y"]) == [b"1", b"2"]
    store.append("x", "+")
    store.append("new", "z")
    assert store.multi_get(["x", "new"]) == [b"1+", b"z"]
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        store.multi_set(["p", "q"], ["1"])


def test_get_and_wait_block_until_another_client_sets(server, store):
    other = job_store.JobStore(server.address, SECRET, timeout=30.0)
    got: dict[str, object] = {}

    def waiter() -> None:
        got["wait"] = store.wait(["later", "later2"])
        got["value"] = store.get("later")

    thread = threading.Thread(target=waiter)
    thread.start()
    other.set("later", "v")
    other.set("later2", "w")
    thread.join(60)
    assert got == {"wait": None, "value": b"v"}
    other.close()


def test_timeouts_raise_torchs_store_error(store):
    with pytest.raises(dist.DistStoreError, match=r"timed out after 0.2 s .* \['never'\]"):
        store.wait(["never"], datetime.timedelta(milliseconds=200))
    store.set_timeout(datetime.timedelta(milliseconds=200))
    with pytest.raises(dist.DistStoreError, match="for never"):
        store.get("never")
    with pytest.raises(dist.DistStoreError):
        store.multi_get(["never"])
    store.set("after", "1")  # the connection is still good
    assert store.get("after") == b"1"


def _on_loop(server: job_store.JobStoreServer, read: Callable[[], object]) -> object:
    """``read()`` run on the server's own thread, between two of its callbacks."""
    done = threading.Event()
    box: list[object] = []

    def run() -> None:
        box.append(read())
        done.set()

    server._loop.call_soon_threadsafe(run)
    assert done.wait(30)
    return box[0]


def _waiting_keys(server: job_store.JobStoreServer) -> dict[str, int]:
    """How many requests wait for each key, read on the server's thread."""
    counts = _on_loop(server, lambda: {k: len(v) for k, v in server._waiters.items()})
    assert isinstance(counts, dict)
    return counts


def _until(condition: Callable[[], bool], guard_s: float = 60.0) -> None:
    """Return once ``condition()`` holds (it reads the server's state); fail after the hang guard."""
    end = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < end, "the server never got there"
        time.sleep(0.005)


def test_a_write_wakes_only_the_requests_waiting_for_its_key(server, store):
    clients = [job_store.JobStore(server.address, SECRET, timeout=30.0) for _ in range(6)]
    got: dict[int, bytes] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, clients[i].get(f"k{i % 3}")))
               for i in range(6)]
    for t in threads:
        t.start()
    _until(lambda: sum(_waiting_keys(server).values()) == 6)
    assert _waiting_keys(server) == {"k0": 2, "k1": 2, "k2": 2}
    store.set("k1", "one")
    threads[1].join(30)
    threads[4].join(30)
    assert got == {1: b"one", 4: b"one"}
    assert _waiting_keys(server) == {"k0": 2, "k2": 2}  # the others were not even looked at
    store.multi_set(["k0", "k2"], ["zero", "two"])
    for t in threads:
        t.join(30)
    assert got == {0: b"zero", 1: b"one", 2: b"two", 3: b"zero", 4: b"one", 5: b"two"}
    assert _waiting_keys(server) == {}
    for c in clients:
        c.close()


def test_a_wait_for_several_keys_waits_for_each_and_a_timed_out_one_leaves_nothing_behind(server, store):
    with pytest.raises(dist.DistStoreError):
        store.wait(["a", "b"], datetime.timedelta(milliseconds=100))
    assert _waiting_keys(server) == {}
    other = job_store.JobStore(server.address, SECRET, timeout=30.0)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (other.wait(["a", "b"]), done.set()))
    thread.start()
    _until(lambda: _waiting_keys(server) == {"a": 1})
    store.set("a", "1")
    _until(lambda: _waiting_keys(server) == {"b": 1})  # moved on to the next missing key
    assert not done.is_set()
    store.set("b", "2")
    thread.join(30)
    assert done.is_set()
    other.close()


def test_a_request_behind_a_waiting_one_is_answered_after_it(server, store):
    """Requests on one connection are answered in order, even when the first one waits."""
    other = job_store.JobStore(server.address, SECRET, timeout=30.0)
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(other.get("late")))
    thread.start()
    _until(lambda: _waiting_keys(server) == {"late": 1})
    store.set("late", "v")
    thread.join(30)
    assert results == [b"v"]
    assert other.add("n", 2) == 2  # the connection goes on after a reply that waited
    other.close()


def test_a_burst_of_ranks_connecting_at_once_is_served_without_refusals(server, monkeypatch):
    """Ranks start together: each connects once (the bound used to refuse most of a large burst)."""
    count = 300
    go = threading.Event()
    connects: list[int] = []
    errors: list[BaseException] = []
    real_connect = socket.create_connection
    tries = threading.local()

    def counted(*args: object, **kwargs: object) -> socket.socket:
        tries.n = getattr(tries, "n", 0) + 1
        return real_connect(*args, **kwargs)  # type: ignore[arg-type]

    def rank(r: int) -> None:
        go.wait()
        try:
            client = job_store.JobStore(server.address, SECRET, timeout=120.0)
            if client.add("arrived", 1) == count:
                client.set("all", "1")
            client.get("all")
            connects.append(tries.n)
            client.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    monkeypatch.setattr(socket, "create_connection", counted)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(count)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert server.refused == 0
    assert server.accepted == count
    assert connects == [1] * count


def test_the_handshake_bound_follows_the_descriptor_limit(monkeypatch):
    import resource

    for soft, bound in ((20000, 9872), (1024, 384), (256, job_store.MAX_HANDSHAKES)):
        monkeypatch.setattr(resource, "getrlimit", lambda _which, soft=soft: (soft, 1 << 20))
        assert job_store.default_max_handshakes() == bound


def test_retries_back_off_with_jitter_up_to_a_second():
    first = [job_store.retry_delay(0) for _ in range(200)]
    late = [job_store.retry_delay(12) for _ in range(200)]
    assert min(first) >= 0.025
    assert max(first) <= 0.075
    assert len(set(first)) > 100  # spread out, not all at once
    assert min(late) >= 0.5
    assert max(late) <= 1.5


class _Interrupted(Exception):
    pass


def test_a_request_interrupted_by_a_signal_drops_the_connection_instead_of_reading_its_reply_later(
        server, store, monkeypatch):
    """The launcher's Ctrl-C arrives as an exception raised wherever its main thread is, often waiting
    for a reply; the next request on that connection must not take the late reply for its own."""
    receiving = threading.Event()
    real_receive = job_store.JobStore._receive

    def receive(self: job_store.JobStore, sock: socket.socket) -> bytes:
        receiving.set()
        return real_receive(self, sock)

    def interrupt(_signum: int, _frame: object) -> None:
        raise _Interrupted

    monkeypatch.setattr(job_store.JobStore, "_receive", receive)
    previous = signal.signal(signal.SIGUSR1, interrupt)
    main = threading.get_ident()
    sender = threading.Thread(target=lambda: receiving.wait(60) and signal.pthread_kill(main, signal.SIGUSR1))
    try:
        sender.start()
        with pytest.raises(_Interrupted):
            store.wait(["never"], datetime.timedelta(seconds=2))
    finally:
        sender.join(60)
        signal.signal(signal.SIGUSR1, previous)
    # Kept open, the connection would hand the wait's timeout reply to this request.
    with pytest.raises(JobStoreError, match="connection to the job store .* is closed"):
        store.set("k", "v")
    fresh = job_store.JobStore(server.address, SECRET, timeout=30.0)
    fresh.set("k", "v")
    assert fresh.get("k") == b"v"
    fresh.close()


def test_prefix_store_and_a_gloo_group_run_on_it(server):
    clients = [job_store.JobStore(server.address, SECRET, timeout=60.0) for _ in range(2)]
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        try:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = datetime.timedelta(seconds=60)
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            group = dist.ProcessGroupGloo(dist.PrefixStore("job", clients[r]), r, 2, options)
            tensor = torch.tensor([float(r + 1)])
            group.allreduce([tensor]).wait()
            results[r] = tensor.item()
        except BaseException as exc:  # handed to the test
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {0: 3.0, 1: 3.0}
    prefixed = dist.PrefixStore("p", clients[0])  # torch joins prefix and key with "/"
    prefixed.set("k", "v")
    assert clients[1].get("p/k") == b"v"
    for client in clients:
        client.close()


def test_a_client_waits_for_a_server_that_starts_later():
    port = free_port()
    result: dict[str, object] = {}

    def connect() -> None:
        try:
            client = job_store.JobStore(f"127.0.0.1:{port}", SECRET, timeout=60.0)
            result["value"] = client.get("k")
            client.close()
        except BaseException as exc:
            result["value"] = exc

    thread = threading.Thread(target=connect)
    thread.start()
    with job_store.JobStoreServer(SECRET, port=port) as srv:
        job_store.JobStore(srv.address, SECRET, timeout=30.0).set("k", "here")
        thread.join(60)
    assert result == {"value": b"here"}


def test_nothing_listening_is_an_error_with_the_address_and_a_hint():
    port = free_port()
    with pytest.raises(JobStoreError, match=rf"cannot reach the job store at 127\.0\.0\.1:{port}.*HINT"):
        job_store.JobStore(f"127.0.0.1:{port}", SECRET, timeout=0.3)


def test_the_server_binds_the_address_it_is_given():
    with job_store.JobStoreServer(SECRET, host="127.0.0.1") as srv:
        assert srv.host == "127.0.0.1"
        assert srv.address == f"127.0.0.1:{srv.port}"
    with pytest.raises(OSError, match=r"cannot listen on 192\.0\.2\.1:0"):
        job_store.JobStoreServer(SECRET, host="192.0.2.1")  # TEST-NET: not an address of this host


def test_a_closed_server_fails_its_clients_with_a_hint(server, store):
    store.set("k", "v")
    server.close()
    with pytest.raises(JobStoreError, match="lost the connection to the job store.*HINT"):
        store.get("k")


# ------------------------------------------------------------------------------------ outsiders
def test_a_client_with_another_secret_is_refused_and_logged_once(server, store, caplog):
    store.set("k", "job")
    caplog.set_level(logging.WARNING, logger="ringtrain.security")
    for wrong in ("b" * 64, None, "b" * 64):
        with pytest.raises(AuthenticationError, match="does not hold the same secret.*HINT"):
            job_store.JobStore(server.address, wrong, timeout=5.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "ringtrain.security"]
    assert len(lines) == 1, lines  # one line for the source host, the later refusals are counted
    assert "did not prove the job's secret" in lines[0]
    assert "\n" not in lines[0]
    assert server.refused == 3
    assert store.get("k") == b"job"  # the job's own connection goes on


def test_a_server_without_the_secret_is_not_trusted():
    # A rank never talks to an impostor's store: the proof goes both ways.
    with job_store.JobStoreServer("c" * 64) as impostor, pytest.raises(AuthenticationError):
        job_store.JobStore(impostor.address, SECRET, timeout=5.0)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_like_another_program() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n" + b"x" * 40)
        with contextlib.suppress(OSError):
            conn.recv(100)
        conn.close()

    thread = threading.Thread(target=answer_like_another_program)
    thread.start()
    with pytest.raises(AuthenticationError, match=rf"127\.0\.0\.1:{port} is not a ringtrain job store.*HINT"):
        job_store.JobStore(f"127.0.0.1:{port}", SECRET, timeout=5.0)
    thread.join(30)
    listener.close()


def _request(op: int, *items: bytes) -> bytes:
    """A request frame as a client would send it, tagged with a key the outsider does not have."""
    body = bytes([op]) + job_store._pack_items(list(items))
    return job_store._LENGTH.pack(len(body)) + body + b"\x00" * job_store._TAG_BYTES


def test_an_outsider_can_neither_read_nor_write(server, store):
    store.set("ctrl/addr/0", "10.0.0.1:1234")
    # (each attempt below is closed at once: none of them starts with the client's greeting)
    attempts = [
        # no handshake at all: a request straight away
        _request(job_store._SET, b"ctrl/addr/0", b"evil:1"),
        # the greeting with a made-up proof, then requests
        job_store._MAGIC + os.urandom(64) + _request(job_store._SET, b"ctrl/addr/0", b"evil:1")
        + _request(job_store._GET, b"ctrl/addr/0", b"1000"),
        # torch's TCPStore protocol (validate, then a SET of the same key)
        b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01" + struct.pack("<Q", 11) + b"ctrl/addr/0",
    ]
    for payload in attempts:
        with socket.create_connection(("127.0.0.1", server.port)) as outsider:
            outsider.sendall(payload)
            received = b""
            outsider.settimeout(60)
            while chunk := outsider.recv(4096):
                received += chunk
            # All an outsider ever gets: the greeting (magic + a nonce) and perhaps the refusal byte.
            assert len(received) <= len(job_store._MAGIC) + auth.NONCE_BYTES + 1
            assert b"10.0.0.1" not in received
    assert store.get("ctrl/addr/0") == b"10.0.0.1:1234"
    assert server.refused == len(attempts)


class _Relay:
    """A TCP relay between one client and the server that records (and may change) what passes."""

    def __init__(self, target_port: int, change: Callable[[int, bytes], bytes] | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target_port = target_port
        self.change = change
        self.from_client: list[bytes] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        count = 0
        # Either side closing (or resetting) ends the relay, and both connections with it.
        with client, upstream, contextlib.suppress(OSError):
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 60)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        if self.change is not None:
                            data = self.change(count, data)
                        count += 1
                        self.from_client.append(data)
                        upstream.sendall(data)
                    else:
                        client.sendall(data)


def test_a_recorded_handshake_and_requests_cannot_be_replayed(server, store):
    relay = _Relay(server.port)
    victim = job_store.JobStore(f"127.0.0.1:{relay.port}", SECRET, timeout=30.0)
    assert victim.add("counter", 1) == 1
    victim.close()
    relay.thread.join(30)
    recorded = b"".join(relay.from_client)
    assert len(recorded) > len(job_store._MAGIC) + auth.NONCE_BYTES + auth.PROOF_BYTES
    with socket.create_connection(("127.0.0.1", server.port)) as replay:
        replay.sendall(recorded)
        assert _wait_closed(replay)
    assert store.get("counter") == b"1"  # the replayed add did not run


def test_a_relay_cannot_change_requests_after_the_handshake(server, store, caplog):
    caplog.set_level(logging.WARNING, logger="ringtrain.security")

    def flip_after_handshake(index: int, data: bytes) -> bytes:
        if index == 0:  # the client's proof passes untouched
            return data
        return data.replace(b"10.0.0.1", b"66.6.6.6")

    relay = _Relay(server.port, flip_after_handshake)
    victim = job_store.JobStore(f"127.0.0.1:{relay.port}", SECRET, timeout=30.0)
    with pytest.raises(JobStoreError, match="lost the connection"):
        victim.set("ctrl/addr/0", "10.0.0.1:1234")
    assert not store.check(["ctrl/addr/0"])
    assert any("integrity check" in r.getMessage() for r in caplog.records)


def test_garbage_is_closed_logged_in_one_line_and_the_store_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="ringtrain.security")
    # A short deadline: a payload shorter than the greeting waits for it like an idle connection.
    with job_store.JobStoreServer(SECRET, handshake_timeout=0.5) as srv:
        store = job_store.JobStore(srv.address, SECRET, timeout=30.0)
        payloads = [b"GET / HTTP/1.0\r\n\r\n", os.urandom(512), b"\x00", job_store._MAGIC + b"\xff" * 200]
        for payload in payloads:
            with socket.create_connection(("127.0.0.1", srv.port)) as outsider:
                outsider.sendall(payload)
                assert _wait_closed(outsider)
        lines = [r.getMessage() for r in caplog.records if r.name == "ringtrain.security"]
        assert len(lines) == 1, lines
        assert "\n" not in lines[0]
        assert not any(r.exc_info for r in caplog.records)
        assert srv.refused == len(payloads)
        store.set("k", "v")
        assert store.get("k") == b"v"
        store.close()


def test_idle_connections_do_not_hold_up_the_job(server, store):
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    try:
        # A rank connects and works while all 50 are still open: its handshake did not queue behind
        # theirs (the server's deadline for them is 10 s; nothing here waits for it).
        late = job_store.JobStore(server.address, SECRET, timeout=30.0)
        late.set("k", "v")
        assert store.get("k") == b"v"
        assert all(_still_open(sock) for sock in idle)
        late.close()
    finally:
        for sock in idle:
            sock.close()


def test_handshakes_are_bounded_and_have_a_deadline():
    # (handshake_grace=0: the oldest gives way at once; the grace has a test of its own below)
    with job_store.JobStoreServer(SECRET, max_handshakes=8, handshake_timeout=60.0,
                                  handshake_grace=0.0) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
        try:
            client = job_store.JobStore(srv.address, SECRET, timeout=30.0)
            client.set("k", "v")
            # Beyond the bound the oldest unproven connections were closed to make room.
            assert _wait_closed(idle[0])
            assert _still_open(idle[-1])
            client.close()
        finally:
            for sock in idle:
                sock.close()
    with job_store.JobStoreServer(SECRET, handshake_timeout=0.2) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as silent:
            assert _wait_closed(silent)
        assert srv.refused == 1


# ------------------------------------------------------------------------------------ the secret
def test_secret_from_the_environment():
    assert job_store.secret_from_environ({}) is None
    assert job_store.secret_from_environ({"RINGTRAIN_JOB_SECRET": "  "}) is None
    assert job_store.secret_from_environ({"RINGTRAIN_JOB_SECRET": f" {SECRET}\n"}) == SECRET
    with pytest.raises(SettingError, match=r"RINGTRAIN_JOB_SECRET holds 6 characters.*HINT: export"):
        job_store.secret_from_environ({"RINGTRAIN_JOB_SECRET": "123456"})
    fresh = job_store.new_secret()
    assert len(fresh) == 64
    assert fresh != job_store.new_secret()
    int(fresh, 16)


def test_addresses():
    assert job_store.split_address("10.1.2.3:29400") == ("10.1.2.3", 29400)
    assert job_store.split_address("[::1]:80") == ("::1", 80)
    assert job_store.join_address("::1", 80) == "[::1]:80"
    assert job_store.address_from_environ({"RINGTRAIN_JOB_STORE": "h:1"}) == "h:1"
    assert job_store.address_from_environ({}) is None
    for bad in ("nohost", "h:", ":12", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="is not HOST:PORT.*HINT"):
            job_store.split_address(bad)


def test_a_relay_cannot_replay_a_request_inside_the_connection(server, store, caplog):
    caplog.set_level(logging.WARNING, logger="ringtrain.security")

    def repeat_first_request(index: int, data: bytes) -> bytes:
        return data + data if index == 1 else data

    relay = _Relay(server.port, repeat_first_request)
    victim = job_store.JobStore(f"127.0.0.1:{relay.port}", SECRET, timeout=30.0)
    assert victim.add("counter", 1) == 1
    with pytest.raises(JobStoreError, match="lost the connection"):
        victim.add("counter", 1)  # the server closed the connection at the repeated copy
    assert store.get("counter") == b"1"
    assert any("integrity check" in r.getMessage() for r in caplog.records)


def test_young_handshakes_are_not_pushed_out_newcomers_are_refused_until_the_grace_passes():
    with job_store.JobStoreServer(SECRET, max_handshakes=4, handshake_timeout=60.0,
                                  handshake_grace=30.0) as srv:
        first = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
        try:
            for sock in first:  # each got its greeting: the server holds all four in their handshake
                sock.settimeout(30)
                assert sock.recv(1)
            with socket.create_connection(("127.0.0.1", srv.port)) as newcomer:
                assert _wait_closed(newcomer)  # refused at once, not after 30 s
            assert all(_still_open(sock) for sock in first)
        finally:
            for sock in first:
                sock.close()


@pytest.mark.slow
def test_a_flood_of_connections_neither_starves_the_ranks_nor_prints_tracebacks(capfd, caplog):
    """A bounded flood on loopback (4 threads, 5 s): ranks still connect and work; one log line."""
    deadline_s, worst = 5.0, 0.0
    with caplog.at_level(logging.WARNING, logger="ringtrain.security"):
        srv = job_store.JobStoreServer(SECRET)
        stop = threading.Event()
        opened = [0]

        def flood() -> None:
            held: list[socket.socket] = []
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=2))
                    opened[0] += 1
                if len(held) > 200:
                    for sock in held[:100]:
                        sock.close()
                    del held[:100]
            for sock in held:
                sock.close()

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        served = 0
        try:
            end = time.monotonic() + deadline_s
            while time.monotonic() < end or served < 3:
                started = time.monotonic()
                rank = job_store.JobStore(srv.address, SECRET, timeout=60.0)  # a rank that starts late
                rank.set(f"k{served}", b"v")
                assert rank.get(f"k{served}") == b"v"
                rank.close()
                worst = max(worst, time.monotonic() - started)
                served += 1
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
            srv.close()
    err = capfd.readouterr().err
    assert opened[0] > 100, "the flood did not flood"
    assert served >= 3
    assert "Traceback" not in err
    assert "Task was destroyed" not in err
    assert len(caplog.records) <= 2  # one line per source address (127.0.0.1), not one per connection
    assert worst < 30, f"a rank waited {worst:.1f} s for the job store"
