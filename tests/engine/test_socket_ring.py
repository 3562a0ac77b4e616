"""The ring allreduce over the control plane's sockets: numerics, uneven chunks, failures, and the engine."""

from __future__ import annotations

import pytest
import torch

from ringtrain.engine import control_plane as cp
from ringtrain.engine.executor import COMBINE
from ringtrain.engine.requests import MAX, MIN, PRODUCT, SUM
from ringtrain.engine.settings import Settings
from ringtrain.engine.socket_ring import ring_allreduce
from tests.engine.hvd_env import fresh
from tests.engine.test_control_plane import _open_mesh, _per_rank

_REFERENCE = {SUM: torch.add, MIN: torch.minimum, MAX: torch.maximum, PRODUCT: torch.mul}


def _ring_all(planes, inputs, op, members=None, piece_bytes=64):
    members = list(range(len(planes))) if members is None else members
    outputs = {r: inputs[r].clone() for r in members}
    combine = COMBINE[op]
    results = _per_rank(
        lambda r: ring_allreduce(planes[r], members, outputs[r], combine, piece_bytes=piece_bytes), members
    )
    errors = [exc for exc in results.values() if exc is not None]
    assert not errors, errors
    return outputs


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 2, 3, 5, 97, 1000])
def test_integer_sums_are_exact_for_every_length(size, numel):
    with _open_mesh(size) as planes:
        inputs = [torch.arange(numel, dtype=torch.int64) * (r + 1) + r for r in range(size)]
        outputs = _ring_all(planes, inputs, SUM)
        expected = sum(inputs[1:], inputs[0])
        for r in range(size):
            assert torch.equal(outputs[r], expected), r


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (op, dtype)
        for op in (SUM, MIN, MAX, PRODUCT)
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.bool)
        if not (dtype == torch.bool and op == PRODUCT)  # not a Horovod operation
    ],
)
def test_every_op_matches_a_reduction_and_is_bit_identical(op, dtype):
    with _open_mesh(3) as planes:
        gen = torch.Generator().manual_seed(7)
        # Small integers stay exact in every dtype, whatever order the ring folds them in.
        inputs = [torch.randint(-3, 4, (301,), generator=gen).to(dtype) for _ in range(3)]
        outputs = _ring_all(planes, inputs, op, piece_bytes=32)
        expected = inputs[0]
        for part in inputs[1:]:
            expected = _REFERENCE[op](expected, part)
        for r in range(3):
            assert torch.equal(outputs[r], expected), (r, dtype, op)
            assert torch.equal(outputs[r].view(torch.uint8), outputs[0].view(torch.uint8))


def test_random_floats_give_bit_identical_results_on_every_rank():
    with _open_mesh(4) as planes:
        inputs = [torch.randn(10_007, generator=torch.Generator().manual_seed(r)) for r in range(4)]
        outputs = _ring_all(planes, inputs, SUM, piece_bytes=4096)
        for r in range(1, 4):
            assert torch.equal(outputs[r].view(torch.int32), outputs[0].view(torch.int32))
        torch.testing.assert_close(outputs[0], sum(inputs[1:], inputs[0]))


def test_a_subset_of_ranks_rings_among_itself_in_set_order():
    with _open_mesh(4) as planes:
        inputs = {r: torch.full((50,), float(r)) for r in range(4)}
        outputs = _ring_all(planes, inputs, SUM, members=[3, 1])
        assert set(outputs) == {1, 3}
        assert all(torch.equal(outputs[r], torch.full((50,), 4.0)) for r in (1, 3))
        # The other ranks' connections were not touched: a full-mesh exchange still lines up.
        got = _per_rank(lambda r: [bytes(m) for m in planes[r].allgather(b"%d" % r)], range(4))
        assert all(got[r] == [b"0", b"1", b"2", b"3"] for r in range(4))


def test_non_contiguous_tensors_are_reduced_in_place():
    with _open_mesh(2) as planes:
        bases = [torch.arange(40, dtype=torch.float32).reshape(8, 5) * (r + 1) for r in range(2)]
        columns = {r: bases[r][:, 1] for r in range(2)}
        _per_rank(lambda r: ring_allreduce(planes[r], [0, 1], columns[r], torch.add), range(2))
        for r in range(2):
            assert torch.equal(bases[r][:, 1], torch.arange(1, 40, 5, dtype=torch.float32) * 3)


def test_a_peer_that_closes_mid_allreduce_is_an_error_that_names_it():
    with _open_mesh(3) as planes:
        planes[2].close()
        tensors = {r: torch.ones(1000) for r in range(2)}
        out = _per_rank(lambda r: ring_allreduce(planes[r], [0, 1, 2], tensors[r], COMBINE[SUM]), range(2))
        assert all(isinstance(out[r], cp.ControlPlaneError) for r in range(2)), out
        assert any("rank 2" in str(out[r]) for r in range(2)), out


def test_streams_out_of_step_fail_loudly_instead_of_reducing_garbage():
    with _open_mesh(2) as planes:
        tensors = {0: torch.ones(100), 1: torch.ones(101)}
        out = _per_rank(lambda r: ring_allreduce(planes[r], [0, 1], tensors[r], torch.add), range(2))
        errors = [exc for exc in out.values() if isinstance(exc, cp.ControlPlaneError)]
        assert any("out of step" in str(exc) for exc in errors), out


def test_a_silent_peer_times_out():
    with _open_mesh(2, round_timeout_s=0.5) as planes, pytest.raises(
        cp.ControlPlaneError, match="RINGTRAIN_ROUND_TIMEOUT_SECONDS"
    ):
        ring_allreduce(planes[0], [0, 1], torch.ones(10), torch.add)


def test_unknown_cpu_allreduce_names_the_value(monkeypatch):
    monkeypatch.setenv("RINGTRAIN_CPU_ALLREDUCE", "nccl")
    with pytest.raises(ValueError, match="RINGTRAIN_CPU_ALLREDUCE='nccl'.*HINT"):
        Settings.from_environ().cpu_allreduce


def _large_allreduces(mode: str) -> list:
    """Allreduces too large for the mesh, through the engine: ring or gloo, same agreed answers."""
    import ringtrain.mpi_ops as hvd
    from ringtrain.engine import state

    fresh({"HOROVOD_DYNAMIC_PROCESS_SETS": "1", **({"RINGTRAIN_CPU_ALLREDUCE": mode} if mode else {})})
    rank, size = hvd.rank(), hvd.size()
    engine = state.engine
    results = [engine.cpu_ring, engine.groups.arena is not None]
    ops = {hvd.Sum: torch.add, hvd.Min: torch.minimum, hvd.Max: torch.maximum}
    for dtype in (torch.float32, torch.float16, torch.int32, torch.int16):
        gen = torch.Generator().manual_seed(rank)
        mine = torch.randint(-50, 50, (300_001,), generator=gen).to(dtype)  # 0.6-1.2 MB: not the mesh
        inputs = hvd.allgather(mine.unsqueeze(0))
        for op, combine in ops.items():
            out = hvd.allreduce(mine, op=op, name=f"big.{dtype}.{op}")
            expected = inputs[0]
            for r in range(1, size):
                expected = combine(expected, inputs[r])
            assert torch.equal(out, expected), (dtype, op)
            results.append(f"{dtype}/{op}")
    average = hvd.allreduce(torch.full((400_000,), float(rank)), name="big.avg")
    assert torch.equal(average, torch.full((400_000,), (size - 1) / 2))
    # Fused: several tensors in one buffer, with pre- and postscale.
    # Every element differs, so a piece unfused at the wrong offset cannot go unseen.
    tensors = [torch.arange(200_000 + i, dtype=torch.float32) * (rank + 1) + i for i in range(3)]
    outs = hvd.grouped_allreduce(tensors, name="big.group", op=hvd.Sum, prescale_factor=2.0,
                                 postscale_factor=0.5)
    for i, out in enumerate(outs):
        expected = torch.arange(200_000 + i, dtype=torch.float32) * sum(range(1, size + 1)) + size * i
        assert torch.equal(out, expected)
    # A process set of the first and last rank rings among its members only.
    pair = hvd.add_process_set([0, size - 1])
    if rank in (0, size - 1):
        out = hvd.allreduce(torch.full((300_000,), float(rank)), op=hvd.Sum, process_set=pair)
        assert torch.equal(out, torch.full((300_000,), float(size - 1)))
    hvd.barrier()
    hvd.remove_process_set(pair)
    results.append(engine.groups.arena.runs > 0 if engine.groups.arena is not None else None)
    return results


@pytest.mark.parametrize("mode", ["", "ring", "gloo"])
def test_large_allreduces_through_the_engine(ranks3, mode):
    """The default (auto) runs them through shared memory here (one host); ring and gloo as asked."""
    results = ranks3.run(_large_allreduces, mode)
    assert [r[0] for r in results] == [mode != "gloo"] * 3
    assert [r[1] for r in results] == [mode == ""] * 3
    assert results[0] == results[1] == results[2]
    assert len(results[0]) == 15
    assert results[0][-1] == (True if mode == "" else None)
