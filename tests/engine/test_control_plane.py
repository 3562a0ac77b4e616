"""The socket mesh that carries negotiation rounds: setup, exchange, strangers, failures, fallback."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from ringtrain.engine import control_plane as cp
from ringtrain.engine.settings import Settings
from tests.engine.hvd_env import fresh


def _per_rank(fn, ranks) -> dict[int, object]:
    """``fn(rank)`` for every rank at once, one thread each: results, or the exception raised."""
    out: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
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


def test_strangers_and_impostors_are_turned_away():
    store = dist.HashStore()
    planes: dict[int, cp.ControlPlane] = {}

    def connect(rank: int) -> None:
        planes[rank] = cp.ControlPlane.connect(store, rank, 2, "127.0.0.1", 20.0, 30.0)

    first = threading.Thread(target=connect, args=(0,))
    first.start()
    store.wait(["ctrl/addr/0"])
    port = int(__import__("json").loads(store.get("ctrl/addr/0"))["port"])
    token = store.get("ctrl/token")
    # Wrong token, then rank 0 claiming to be itself, then a silent connection: all dropped.
    for hello in (
        cp._HELLO.pack(cp._MAGIC, b"0" * 32, 1),
        cp._HELLO.pack(cp._MAGIC, token, 0),
        b"GET / HTTP/1.0\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", port)) as stranger:
            stranger.sendall(hello)
    second = threading.Thread(target=connect, args=(1,))
    second.start()
    first.join(30)
    second.join(30)
    try:
        assert _allgather_all([planes[0], planes[1]], [b"a", b"b"]) == [[b"a", b"b"]] * 2
    finally:
        for plane in planes.values():
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


def test_candidate_addresses_include_the_route_to_the_store():
    assert "127.0.0.1" in cp.candidate_addresses("127.0.0.1")


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
