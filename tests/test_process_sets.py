"""Process sets: static and dynamic registration, collectives on subsets, global root ranks."""

from __future__ import annotations

import pytest
import torch

import ringtrain.mpi_ops as hvd
from tests.engine.hvd_env import fresh


def _static_sets() -> dict:
    even, upper = hvd.ProcessSet([2, 0]), hvd.ProcessSet([1, 2])
    assert even.ranks == [0, 2]
    assert even.process_set_id is None
    assert even.size() is None
    fresh(process_sets=[even, upper])
    rank = hvd.rank()
    # Unnamed ops are named by a per-process counter (as in Horovod), so ranks that belong to several
    # sets name their ops explicitly to keep them matched.
    out: dict = {
        "ids": (hvd.global_process_set.process_set_id, even.process_set_id, upper.process_set_id),
        "str": str(even),
        "even_rank": even.rank(),
        "included": even.included(),
        "size": even.size(),
    }
    if even.included():
        out["even_sum"] = hvd.allreduce(torch.ones(2) * (rank + 1), op=hvd.Sum, process_set=even).tolist()
        out["even_gather"] = hvd.allgather(torch.tensor([rank]), process_set=even).tolist()
        out["even_bcast"] = hvd.broadcast(torch.tensor([rank]), 2, process_set=even).tolist()
        hvd.barrier(process_set=even)
    else:
        with pytest.raises(ValueError, match=f"Rank {rank} is not a member of the provided process set"):
            hvd.allreduce(torch.ones(1), process_set=even)
    if upper.included():
        out["upper_avg"] = hvd.allreduce(torch.ones(1) * rank, name="up", process_set=upper).tolist()
        with pytest.raises(ValueError, match="invalid root rank 0"):
            hvd.broadcast(torch.ones(1), 0, process_set=upper)
    # A name may be pending in two sets at once.
    handles = []
    if even.included():
        handles.append(hvd.allreduce_async(torch.ones(1), name="shared", op=hvd.Sum, process_set=even))
    if upper.included():
        handles.append(hvd.allreduce_async(torch.ones(1), name="shared", op=hvd.Sum, process_set=upper))
    out["shared"] = [hvd.synchronize(h).item() for h in handles]
    with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS"):
        hvd.add_process_set([0, 1])
    return out


def test_static_process_sets(ranks3):
    results = ranks3.run(_static_sets)
    for rank, res in enumerate(results):
        assert res["ids"] == (0, 1, 2)
        assert res["str"] == "ProcessSet(process_set_id=1, ranks=[0, 2], mpi_comm=None)"
        assert res["size"] == 2
        assert res["shared"] == [2.0] * (2 if rank == 2 else 1)
    assert [r["even_rank"] for r in results] == [0, -1, 1]
    assert [r["included"] for r in results] == [True, False, True]
    assert results[0]["even_sum"] == results[2]["even_sum"] == [4.0, 4.0]
    assert results[0]["even_gather"] == [0, 2]
    assert results[0]["even_bcast"] == results[2]["even_bcast"] == [2]
    assert results[1]["upper_avg"] == results[2]["upper_avg"] == [1.5]


def _duplicate_static() -> str:
    with pytest.raises(ValueError, match="is a duplicate") as info:
        fresh(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 0])])
    fresh()
    return str(info.value)


def test_duplicate_static_sets_are_rejected(ranks3):
    ranks3.run(_duplicate_static)


def _dynamic_sets() -> dict:
    fresh(process_sets="dynamic")
    rank = hvd.rank()
    pair = hvd.add_process_set([0, 1])
    out = {"id": pair.process_set_id}
    if pair.included():
        out["sum"] = hvd.allreduce(torch.ones(1), name="p", op=hvd.Sum, process_set=pair).item()
    with pytest.raises(ValueError, match="Attempted to add a duplicate process set"):
        hvd.add_process_set(hvd.ProcessSet([1, 0]))
    trio = hvd.add_process_set([2, 1])
    out["trio_id"] = trio.process_set_id
    if trio.included():
        out["trio"] = hvd.allgather(torch.tensor([rank]), name="t", process_set=trio).tolist()
    assert hvd.remove_process_set(pair) is True
    assert pair.process_set_id is None
    assert hvd.remove_process_set(pair) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False
    with pytest.raises(ValueError, match="not been registered"):
        hvd.allreduce(torch.ones(1), process_set=pair)
    again = hvd.add_process_set([0, 1])
    if again.included():
        out["again"] = hvd.allreduce(torch.ones(1), name="a", op=hvd.Sum, process_set=again).item()
    # shutdown() ends the engine on every rank: wait until the members are done with their set.
    hvd.barrier()
    fresh()
    return out


def test_dynamic_process_sets(ranks3):
    results = ranks3.run(_dynamic_sets)
    assert [r["id"] for r in results] == [1, 1, 1]
    assert results[0]["sum"] == results[1]["sum"] == 2.0
    assert results[1]["trio"] == results[2]["trio"] == [1, 2]
    assert results[0]["again"] == 2.0


def test_process_set_validates_ranks():
    with pytest.raises(ValueError, match="must be integers"):
        hvd.ProcessSet([0, "1"])
    with pytest.raises(ValueError, match="no MPI build"):
        hvd.ProcessSet(object())
