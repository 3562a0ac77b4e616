"""hvd.join(): joined ranks serve allreduces with zeros; other ops fail while someone is joined."""

from __future__ import annotations

import time

import pytest
import torch

import ringtrain.mpi_ops as hvd
from ringtrain.exceptions import HorovodInternalError
from tests.engine.hvd_env import ensure_init


def _join_serves_allreduce() -> dict:
    ensure_init()
    rank, size = hvd.rank(), hvd.size()
    results: dict = {}
    if rank == 0:
        results["last"] = hvd.join()
    else:
        for step in range(3):  # repeated names go through the response cache
            t = torch.full((3,), float(rank + 1))
            results["avg"] = hvd.allreduce(t, name="grad").tolist()
            results["sum"] = hvd.allreduce(t, name="grad_sum", op=hvd.Sum).tolist()
            results["int"] = hvd.allreduce(torch.full((2,), rank + 1, dtype=torch.int32), name="i").tolist()
            results["unnamed"] = hvd.allreduce(torch.ones(1) * step, op=hvd.Sum).item()
        with pytest.raises(HorovodInternalError, match="Allgather is not supported with Join at this time"):
            hvd.allgather(torch.ones(1), name="ag")
        with pytest.raises(HorovodInternalError, match="Broadcast is not supported with Join at this time"):
            hvd.broadcast(torch.ones(1), 1, name="bc")
        if rank == size - 1:
            time.sleep(0.5)  # join clearly last
        results["last"] = hvd.join()
    # After everyone joined, the engine works normally again.
    results["after"] = hvd.allreduce(torch.ones(1), name="after", op=hvd.Sum).item()
    return results


def test_join_serves_zeros_and_returns_last_rank(ranks3):
    results = ranks3.run(_join_serves_allreduce)
    assert [r["last"] for r in results] == [2, 2, 2]
    for r in results[1:]:
        # Rank 0 contributes zeros; Average still divides by the full size (3).
        assert r["avg"] == pytest.approx([5.0 / 3] * 3)
        assert r["sum"] == [5.0] * 3
        assert r["int"] == [1, 1]  # 5 / 3 truncated toward zero
        assert r["unnamed"] == 4.0
    assert [r["after"] for r in results] == [3.0, 3.0, 3.0]


def _everyone_joins() -> int:
    ensure_init()
    return hvd.join()


def test_join_without_work_returns_same_rank_everywhere(ranks3):
    results = ranks3.run(_everyone_joins)
    assert len(set(results)) == 1
    assert results[0] in (0, 1, 2)
