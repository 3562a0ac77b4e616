"""Disagreements between ranks raise on every rank (never hang), with Horovod's message prefixes."""

from __future__ import annotations

import pytest
import torch

import ringtrain.mpi_ops as hvd
from ringtrain.exceptions import HorovodInternalError
from tests.engine.hvd_env import ensure_init, fresh


def _expect_error(prefix: str, make_handle) -> str:
    handle = make_handle()
    with pytest.raises(HorovodInternalError) as info:
        hvd.synchronize(handle)
    assert str(info.value).startswith(prefix), str(info.value)
    assert isinstance(info.value, RuntimeError)
    return str(info.value)


def _mismatches() -> list[str]:
    ensure_init()
    r = hvd.rank()
    messages = [
        _expect_error(
            "Mismatched data types: One rank had type",
            lambda: hvd.allreduce_async(
                torch.ones(2, dtype=torch.float32 if r == 0 else torch.int32), name="dtype"
            ),
        ),
        _expect_error(
            "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2]",
            lambda: hvd.allreduce_async(torch.ones(2 + r), name="shape"),
        ),
        _expect_error(
            "Mismatched reduction operation",
            lambda: hvd.allreduce_async(torch.ones(2), name="op", op=hvd.Sum if r == 0 else hvd.Max),
        ),
        _expect_error(
            "Mismatched prescale and/or postscale factors",
            lambda: hvd.allreduce_async(torch.ones(2), name="scale", prescale_factor=1.0 + r),
        ),
        _expect_error(
            "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
            "specified root rank 1.",
            lambda: hvd.broadcast_async(torch.ones(2), r, name="root"),
        ),
        _expect_error(
            "Mismatched BROADCAST tensor shapes",
            lambda: hvd.broadcast_async(torch.ones(2, 1 + r), 0, name="bshape"),
        ),
        _expect_error(
            "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 2",
            lambda: hvd.allgather_async(torch.ones(3, 2 + r), name="agdim"),
        ),
        _expect_error(
            "Mismatched ALLGATHER tensor shapes: One rank sent a tensor of rank 2",
            lambda: hvd.allgather_async(torch.ones([2] * (2 + r)), name="agrank"),
        ),
        _expect_error(
            "Mismatched ALLTOALL tensor shapes",
            lambda: hvd.alltoall_async(torch.ones([2] * (2 + r)), name="a2arank"),
        ),
        _expect_error(
            "Mismatched REDUCESCATTER tensor shapes",
            lambda: hvd.reducescatter_async(torch.ones(4, 1 + r), name="rsshape"),
        ),
        _expect_error(
            "Process-set rank zero tried to ALLGATHER a rank-zero tensor.",
            lambda: hvd.allgather_async(torch.tensor(1.0), name="agscalar"),
        ),
        _expect_error(
            "Process-set rank zero tried to REDUCESCATTER a rank-zero tensor.",
            lambda: hvd.reducescatter_async(torch.tensor(1.0), name="rsscalar"),
        ),
    ]
    # The engine keeps working after errors.
    assert hvd.allreduce(torch.ones(1), name="after", op=hvd.Sum).tolist() == [2.0]
    return messages


def test_every_mismatch_raises_on_every_rank(ranks2):
    results = ranks2.run(_mismatches)
    # Both ranks see the same agreed error message.
    assert results[0] == results[1]


def _cache_invalidation() -> None:
    ensure_init()
    r = hvd.rank()
    for _ in range(3):
        assert hvd.allreduce(torch.ones(2), name="reused", op=hvd.Sum).tolist() == [2.0, 2.0]
    # Same name, new shape on every rank: the cached entry is renegotiated, no error.
    assert hvd.allreduce(torch.ones(3), name="reused", op=hvd.Sum).tolist() == [2.0] * 3
    # Same name, new shape on one rank only: renegotiation finds the mismatch; no deadlock.
    _expect_error(
        "Mismatched ALLREDUCE tensor shapes",
        lambda: hvd.allreduce_async(torch.ones(3 if r == 0 else 4), name="reused"),
    )
    assert hvd.allreduce(torch.ones(3), name="reused", op=hvd.Sum).tolist() == [2.0] * 3
    # Allgather with a changing first dimension is re-negotiated every time it changes.
    for step in range(3):
        assert hvd.allgather(torch.ones(step + r + 1), name="ag").shape == (2 * step + 3,)


def test_cached_name_with_new_signature_is_renegotiated(ranks2):
    ranks2.run(_cache_invalidation)


def _tuning(env: dict) -> None:
    fresh(env)
    handles = [hvd.allreduce_async(torch.ones(5) * i, name=f"t{i}", op=hvd.Sum) for i in range(10)]
    for i, h in enumerate(handles):
        assert hvd.synchronize(h).tolist() == [2.0 * i] * 5
    for _ in range(3):
        assert hvd.allreduce(torch.ones(1), name="again", op=hvd.Sum).item() == 2.0
    fresh()


@pytest.mark.parametrize(
    "env",
    [
        {"HOROVOD_CACHE_CAPACITY": "0"},
        {"HOROVOD_CACHE_CAPACITY": "2"},
        {"HOROVOD_FUSION_THRESHOLD": "0"},
        {"HOROVOD_FUSION_THRESHOLD": "64"},
        {"HOROVOD_CYCLE_TIME": "5"},
        {"HOROVOD_CYCLE_TIME": "0"},
    ],
)
def test_tuning_variables_keep_results_correct(ranks2, env):
    ranks2.run(_tuning, env)


def _not_member_and_unregistered() -> None:
    ensure_init()
    ps = hvd.ProcessSet([0])
    with pytest.raises(ValueError, match="Process set provided does not exist, or has not been registered"):
        hvd.allreduce(torch.ones(1), process_set=ps)


def test_unregistered_process_set_is_rejected(ranks2):
    ranks2.run(_not_member_and_unregistered)


def _lru_displaces_pending_entry() -> None:
    fresh({"HOROVOD_CACHE_CAPACITY": "2"})
    rank = hvd.rank()
    for name in ["n2", "n3", "n3"]:
        hvd.allreduce(torch.ones(1), name=name, op=hvd.Sum)
    # Rank 0 has cached "n2" pending when "n5" enters the full cache and evicts "n2" (least recently used).
    if rank == 0:
        h2 = hvd.allreduce_async(torch.ones(1), name="n2", op=hvd.Sum)
    h5 = hvd.allreduce_async(torch.ones(1) * 5, name="n5", op=hvd.Sum)
    assert hvd.synchronize(h5).item() == 10.0
    if rank == 1:
        h2 = hvd.allreduce_async(torch.ones(1), name="n2", op=hvd.Sum)
    assert hvd.synchronize(h2).item() == 2.0
    for name in ["n2", "n3", "n5", "n2"]:
        assert hvd.allreduce(torch.ones(1), name=name, op=hvd.Sum).item() == 2.0
    fresh()


def test_cache_eviction_of_a_pending_name_renegotiates_it(ranks2):
    ranks2.run(_lru_displaces_pending_entry)


def _unknown_handles() -> None:
    ensure_init()
    handle = hvd.allreduce_async(torch.ones(1), name="known", op=hvd.Sum)
    assert hvd.synchronize(handle).tolist() == [hvd.size()]
    assert hvd.synchronize(handle) is None  # already synchronized: None, as in Horovod
    for unknown in (handle + 1000, -1, "0", None):
        with pytest.raises(ValueError, match=rf"synchronize\({unknown!r}\): no operation was started .*HINT"):
            hvd.synchronize(unknown)


def test_synchronize_of_a_handle_never_issued_is_refused(ranks2):
    ranks2.run(_unknown_handles)
