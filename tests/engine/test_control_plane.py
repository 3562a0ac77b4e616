"""The socket mesh that carries negotiation rounds: setup, exchange, strangers, failures, fallback."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from ringtrain.engine import control_plane as cp
from ringtrain.engine.settings import Settings
from ringtrain.exceptions import AuthenticationError
from tests.engine.hvd_env import fresh


def _per_rank(fn, ranks) -> dict[int, object]:
    """``fn(rank)`` for every rank at once, one thread each: results, or the exception raised."""
    out: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as exc:  # handed to the test
            out[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _mesh(size: int, round_timeout_s: float = 30.0) -> list[cp.ControlPlane]:
    """``size`` planes connected through one in-process store."""
    store = dist.HashStore()
    planes = _per_rank(lambda r: cp.ControlPlane.connect(store, r, size, "127.0.0.1", 20.0, round_timeout_s),
                       range(size))
    assert all(isinstance(planes[r], cp.ControlPlane) for r in range(size)), planes
    return [planes[r] for r in range(size)]


@contextlib.contextmanager
def _open_mesh(size: int, round_timeout_s: float = 30.0) -> Iterator[list[cp.ControlPlane]]:
    """A mesh of ``size`` planes, closed afterwards."""
    planes = _mesh(size, round_timeout_s)
    try:
        yield planes
    finally:
        for plane in planes:
            plane.close()


def _allgather_all(planes: list[cp.ControlPlane], messages: list[bytes]) -> list[list[bytes]]:
    out = _per_rank(lambda r: [bytes(m) for m in planes[r].allgather(messages[r])], range(len(planes)))
    return [out[r] for r in range(len(planes))]


def test_allgather_returns_every_rank_message_in_rank_order():
    with _open_mesh(4) as planes:
        for round_number in range(20):
            messages = [f"r{r}-{round_number}".encode() * (r + 1) for r in range(4)]
            messages[2] = b""  # empty messages are allowed (a rank with nothing to say)
            assert _allgather_all(planes, messages) == [messages] * 4


def test_largest_allowed_message_goes_through():
    with _open_mesh(2) as planes:
        big = [bytes([r]) * cp.MAX_MESSAGE_BYTES for r in range(2)]
        assert _allgather_all(planes, big) == [big, big]


def test_a_closed_peer_is_an_error_that_names_it():
    planes = _mesh(3)
    planes[2].close()
    errors = _per_rank(lambda r: planes[r].allgather(b"x"), (0, 1))
    assert sorted(errors) == [0, 1]
    for exc in errors.values():
        assert isinstance(exc, cp.ControlPlaneError)
        assert "closed its control connection" in str(exc)
    assert any("rank 2" in str(exc) for exc in errors.values())
    with pytest.raises(cp.ControlPlaneError, match="closed"):
        planes[0].allgather(b"x")  # a failed plane stays failed
    planes[1].close()


def test_a_silent_peer_times_out():
    planes = _mesh(2, round_timeout_s=0.5)
    with pytest.raises(cp.ControlPlaneError, match="rank 1 sent nothing within the round timeout"):
        planes[0].allgather(b"x")
    planes[1].close()


class _DictStore(dist.Store):
    """A store whose every value the test (playing an outsider who read the store) can list."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def set(self, key, value):
        with self._changed:
            self.values[key] = value.encode() if isinstance(value, str) else bytes(value)
            self._changed.notify_all()

    def get(self, key):
        with self._changed:
            if not self._changed.wait_for(lambda: key in self.values, 60):
                raise dist.DistStoreError(f"no {key}")
            return self.values[key]

    def wait(self, keys, timeout=None):
        with self._changed:
            if not self._changed.wait_for(lambda: all(k in self.values for k in keys), 60):
                raise dist.DistStoreError(f"no {keys}")

    def check(self, keys):
        return all(k in self.values for k in keys)


SECRET = "s" * 64


def _start(store, rank: int, size: int, planes: dict, secret: str | None = SECRET,
           timeout_s: float = 60.0) -> threading.Thread:
    def connect() -> None:
        try:
            planes[rank] = cp.ControlPlane.connect(store, rank, size, "127.0.0.1", timeout_s, 30.0,
                                                   secret=secret, bind_host="127.0.0.1", scope="test/gen1")
        except BaseException as exc:  # handed to the test
            planes[rank] = exc

    thread = threading.Thread(target=connect)
    thread.start()
    return thread


def _port_of(store, rank: int) -> int:
    store.wait([f"ctrl/addr/{rank}"])
    return int(json.loads(store.get(f"ctrl/addr/{rank}"))["port"])


def _closed_by_peer(sock: socket.socket, guard_s: float = 60.0) -> bool:
    """Block until the other side closes ``sock``; False when the hang guard expires first."""
    sock.settimeout(guard_s)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return False
    return True


def _finish(threads: list[threading.Thread], planes: dict, size: int) -> list[cp.ControlPlane]:
    for thread in threads:
        thread.join(120)
    assert all(isinstance(planes.get(r), cp.ControlPlane) for r in range(size)), planes
    return [planes[r] for r in range(size)]


def test_the_store_holds_nothing_that_admits_a_connection(caplog):
    """The issue's attack: read the store, then connect with what it held (the token, once)."""
    caplog.set_level(logging.WARNING, logger="ringtrain.security")
    store, planes = _DictStore(), {}
    threads = [_start(store, 0, 2, planes)]
    port = _port_of(store, 0)
    attempts = 0
    for value in list(store.values.values()):
        token = value[:32].ljust(32, b"0")
        for claimed in (1, 0):
            for hello in (b"RTCTRL01" + token + struct.pack("<I", claimed),  # the old protocol's hello
                          cp._MAGIC + token + struct.pack("<II", claimed, 0) + token):
                with socket.create_connection(("127.0.0.1", port)) as outsider:
                    outsider.sendall(hello)
                    assert _closed_by_peer(outsider)
                attempts += 1
    threads.append(_start(store, 1, 2, planes))
    first, second = _finish(threads, planes, 2)
    try:
        assert _allgather_all([first, second], [b"a", b"b"]) == [[b"a", b"b"]] * 2
        assert first.refused == attempts
        lines = [r.getMessage() for r in caplog.records if r.name == "ringtrain.security"]
        assert len(lines) == 1, lines  # one line per source host, the rest are counted
        assert "not a ringtrain control client" in lines[0]
    finally:
        first.close()
        second.close()


class _Recorder:
    """Forwards one connection to ``port`` and records what the dialing side sent (an on-path
    observer's view of a handshake)."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port, self.target = self.listener.getsockname()[1], port
        self.sent = bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target))
        with client, upstream:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 120)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        self.sent += data
                    (upstream if sock is client else client).sendall(data)


def test_a_recorded_handshake_cannot_be_replayed_or_altered():
    store, planes = _DictStore(), {}
    threads = [_start(store, 0, 3, planes)]
    port = _port_of(store, 0)
    # The observer sits between rank 1 and rank 0 (it rewrote the address rank 1 dials).
    recorder = _Recorder(port)
    info = json.loads(store.get("ctrl/addr/0"))
    store.set("ctrl/addr/0", json.dumps({**info, "port": recorder.port, "bound": "127.0.0.1"}))
    threads.append(_start(store, 1, 3, planes))
    wait_until = threading.Event()
    for _ in range(600):  # rank 1's hello has passed once the recorder saw more than the greeting's reply
        if len(recorder.sent) >= cp._HELLO_BYTES:
            break
        wait_until.wait(0.1)
    hello = bytes(recorder.sent[:cp._HELLO_BYTES])
    assert len(hello) == cp._HELLO_BYTES
    magic, nonce, proof = hello[:8], hello[8:40], hello[48:]
    forged = [hello, magic + nonce + struct.pack("<II", 2, 0) + proof]  # verbatim, and claiming rank 2
    # (the old protocol's hello was plain: magic, token, rank; rewriting the rank made it rank 2's)
    forged.append(b"RTCTRL01" + nonce + struct.pack("<I", 2))
    for replay in forged:
        with socket.create_connection(("127.0.0.1", port)) as outsider:
            outsider.recv(len(cp._MAGIC) + 32)  # the fresh greeting; the replay ignores it
            outsider.sendall(replay)
            assert _closed_by_peer(outsider)
    store.set("ctrl/addr/0", json.dumps(info))  # rank 2 dials rank 0 directly
    threads.append(_start(store, 2, 3, planes))
    mesh = _finish(threads, planes, 3)
    try:
        assert _allgather_all(mesh, [b"a", b"b", b"c"]) == [[b"a", b"b", b"c"]] * 3
        assert mesh[0].refused == len(forged)
    finally:
        for plane in mesh:
            plane.close()


def test_idle_connections_do_not_hold_up_setup(monkeypatch):
    # Unproven connections keep their slot for an hour here: setup must not wait for any of them.
    monkeypatch.setattr(cp, "HANDSHAKE_TIMEOUT", 3600.0)
    store, planes = _DictStore(), {}
    threads = [_start(store, 0, 2, planes)]
    port = _port_of(store, 0)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    try:
        threads.append(_start(store, 1, 2, planes))
        first, second = _finish(threads, planes, 2)
        assert _allgather_all([first, second], [b"a", b"b"]) == [[b"a", b"b"]] * 2
        # Once the mesh was complete the listener closed, and the idle connections with it.
        assert first.refused == 50
        assert all(_closed_by_peer(sock) for sock in idle)
        first.close()
        second.close()
    finally:
        for sock in idle:
            sock.close()


def test_unproven_connections_are_bounded(monkeypatch):
    monkeypatch.setattr(cp, "MAX_PENDING_HANDSHAKES", 4)
    monkeypatch.setattr(cp, "HANDSHAKE_TIMEOUT", 3600.0)
    store, planes = _DictStore(), {}
    threads = [_start(store, 0, 2, planes)]
    port = _port_of(store, 0)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
    try:
        assert _closed_by_peer(idle[0])  # the oldest gave way while setup was still going on
        threads.append(_start(store, 1, 2, planes))
        for plane in _finish(threads, planes, 2):
            plane.close()
    finally:
        for sock in idle:
            sock.close()


def test_garbage_is_closed_and_logged_in_one_line(caplog):
    caplog.set_level(logging.WARNING, logger="ringtrain.security")
    store, planes = _DictStore(), {}
    threads = [_start(store, 0, 2, planes)]
    port = _port_of(store, 0)
    for payload in (b"GET / HTTP/1.0\r\n\r\n" + b"x" * 100, os.urandom(300), pickle.dumps(os.getcwd) * 5):
        with socket.create_connection(("127.0.0.1", port)) as outsider:
            outsider.sendall(payload)
            assert _closed_by_peer(outsider)
    threads.append(_start(store, 1, 2, planes))
    first, second = _finish(threads, planes, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "ringtrain.security"]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    assert first.refused == 3
    first.close()
    second.close()


@pytest.mark.slow
def test_ranks_with_different_secrets_do_not_mesh():
    store, planes = _DictStore(), {}
    # (rank 0 waits 10 s for a rank 1 it would accept; rank 1 dials within that time)
    threads = [_start(store, 0, 2, planes, secret="x" * 64, timeout_s=10.0)]
    _port_of(store, 0)
    threads.append(_start(store, 1, 2, planes, secret="y" * 64))
    for thread in threads:
        thread.join(120)
    # The dialing rank knows at once (it was refused); the other one only sees nobody come.
    assert isinstance(planes[1], AuthenticationError), planes
    assert "rank 0 at 127.0.0.1:" in str(planes[1])
    assert "refused this rank's proof" in str(planes[1])
    assert "HINT: every rank needs the same RINGTRAIN_JOB_SECRET" in str(planes[1])
    assert isinstance(planes[0], cp.ControlPlaneError)


def test_a_one_host_mesh_listens_on_loopback_only():
    store, planes = _DictStore(), {}
    threads = [_start(store, r, 2, planes) for r in range(2)]
    mesh = _finish(threads, planes, 2)
    for rank in range(2):
        info = json.loads(store.get(f"ctrl/addr/{rank}"))
        assert info["bound"] == "127.0.0.1"
        assert info["hosts"] == ["127.0.0.1"]
        assert mesh[rank].peer_socket(1 - rank).getsockname()[0] == "127.0.0.1"
    for plane in mesh:
        plane.close()


def test_a_rank_that_never_connects_times_out_with_a_hint():
    store = dist.HashStore()
    with pytest.raises(cp.ControlPlaneError, match=r"ranks \[1\] did not connect.*HINT"):
        cp.ControlPlane.connect(store, 0, 2, "127.0.0.1", 0.5, 30.0)


def test_unknown_mode_names_the_value(monkeypatch):
    monkeypatch.setenv("RINGTRAIN_CONTROL_PLANE", "mpi")
    with pytest.raises(ValueError, match=r"RINGTRAIN_CONTROL_PLANE='mpi'.*HINT"):
        Settings.from_environ().control_plane
    monkeypatch.setenv("RINGTRAIN_CONTROL_PLANE", "GLOO")
    assert Settings.from_environ().control_plane == "gloo"


# ----------------------------------------------------------------------------- inside real ranks
def _ops_with_plane(mode: str) -> tuple[bool, list[float], int]:
    import ringtrain.mpi_ops as hvd
    from ringtrain.engine import state

    fresh({"RINGTRAIN_CONTROL_PLANE": mode} if mode else {})
    rank = hvd.rank()
    has_plane = state.engine.plane is not None
    values = []
    for step in range(3):
        values.append(float(hvd.allreduce(torch.tensor([rank + step], dtype=torch.float32), op=hvd.Sum)))
    gathered = hvd.allgather(torch.tensor([rank]))
    # Metadata larger than one control message (long names) goes through gloo instead.
    tensors = [torch.full((1,), float(rank)) for _ in range(1500)]
    summed = hvd.grouped_allreduce(tensors, name="x" * 60, op=hvd.Sum)
    assert all(float(t) == 1.0 for t in summed)
    return has_plane, values, int(gathered.sum())


@pytest.mark.parametrize("mode", ["", "gloo"])
def test_rounds_work_over_either_plane(ranks2, mode):
    results = ranks2.run(_ops_with_plane, mode)
    for has_plane, values, gathered in results:
        assert has_plane == (mode != "gloo")
        assert values == [1.0, 3.0, 5.0]
        assert gathered == 1


def _mesh_numerics() -> list[str]:
    """Allreduces over the mesh: every rank gets bit-identical results, reduced in rank order."""
    import ringtrain.mpi_ops as hvd
    from ringtrain.engine import state
    from ringtrain.engine.executor import mesh_fits

    fresh()
    rank, size = hvd.rank(), hvd.size()
    assert state.engine.plane is not None
    assert mesh_fits(state.engine.sets[0], torch.empty(1000))
    assert not mesh_fits(state.engine.sets[0], torch.empty(4 * 1024 * 1024))
    checked = []
    ops = {hvd.Sum: torch.add, hvd.Min: torch.minimum, hvd.Max: torch.maximum, hvd.Product: torch.mul}
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int16, torch.bool):
        generator = torch.Generator().manual_seed(rank)
        mine = (torch.randn(1000, generator=generator) * 5).to(dtype)
        inputs = hvd.allgather(mine.unsqueeze(0))
        for op, combine in ops.items():
            if dtype == torch.bool and op == hvd.Product:
                continue
            out = hvd.allreduce(mine, op=op, name=f"mesh.{dtype}.{op}")
            expected = inputs[0]
            for r in range(1, size):
                expected = combine(expected, inputs[r])
            if dtype == torch.int16:
                expected = expected.to(torch.int32).to(torch.int16)
            assert torch.equal(out, expected), (dtype, op)
            everyone = hvd.allgather(out.unsqueeze(0))
            assert all(torch.equal(everyone[0].view(torch.uint8), row.view(torch.uint8)) for row in everyone)
            checked.append(f"{dtype}/{op}")
    return checked


def test_mesh_allreduce_is_exact_and_identical_on_every_rank(ranks3):
    results = ranks3.run(_mesh_numerics)
    assert results[0] == results[1] == results[2]
    assert len(results[0]) == 23
