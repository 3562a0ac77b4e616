"""The Horovod collectives on real ranks (gloo over loopback): results, dtypes and signatures."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import ringtrain.mpi_ops as hvd
from tests.engine.hvd_env import ensure_init, fresh

REDUCE_DTYPES = [
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.uint8,
    torch.int8,
    torch.int16,
]
MOVE_DTYPES = REDUCE_DTYPES + [torch.bool]


def _lifecycle() -> dict:
    before = {
        "gloo": hvd.gloo_built(),
        "mpi": hvd.mpi_built(),
        "ccl": hvd.ccl_built(),
        "nccl": hvd.nccl_built(),
        "mpi_threads_before_init": hvd.mpi_threads_supported(),
    }
    hvd.shutdown()
    try:
        hvd.rank()
        raised = None
    except ValueError as exc:
        raised = str(exc)
    assert raised == "Horovod has not been initialized; use hvd.init()."
    assert not hvd.is_initialized()
    hvd.init()
    hvd.init()  # idempotent while initialized
    assert hvd.is_initialized()
    out = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "homogeneous": hvd.is_homogeneous(),
        **before,
    }
    # No MPI: a plain answer, never an exception (Horovod without MPI raises ValueError).
    out["mpi_threads"] = hvd.mpi_threads_supported()
    return out


def test_lifecycle_and_topology(ranks2):
    results = ranks2.run(_lifecycle)
    for rank, res in enumerate(results):
        assert res["rank"] == rank
        assert res["size"] == 2
        assert res["local_rank"] == rank
        assert res["local_size"] == 2
        assert res["cross_rank"] == 0
        assert res["cross_size"] == 1
        assert res["homogeneous"] is True
        assert res["gloo"] is True
        assert res["mpi"] is False
        assert res["ccl"] is False
        assert isinstance(res["nccl"], int)
        assert res["mpi_threads"] is False
        assert res["mpi_threads_before_init"] is False


def _allreduce_checks(keep_settings: bool = False) -> None:
    ensure_init(keep_settings)
    rank, size = hvd.rank(), hvd.size()
    for dtype in REDUCE_DTYPES:
        t = (torch.arange(6).reshape(2, 3) + rank).to(dtype)
        total = sum((torch.arange(6).reshape(2, 3) + r) for r in range(size)).to(torch.float64)
        out = hvd.allreduce(t, op=hvd.Sum, name=f"sum.{dtype}")
        assert out.dtype == dtype
        assert torch.equal(out.double(), total), (dtype, out)
        assert torch.equal(t, (torch.arange(6).reshape(2, 3) + rank).to(dtype)), "input changed"
        avg = hvd.allreduce(t, name=f"avg.{dtype}")
        expected = total / size
        expected = expected.trunc() if not dtype.is_floating_point else expected
        assert torch.allclose(avg.double(), expected, atol=1e-2), (dtype, avg)
    x = torch.tensor([3.0, -2.0]) * (rank + 1)
    assert hvd.allreduce(x, op=hvd.Min).tolist() == [3.0, -4.0]
    assert hvd.allreduce(x, op=hvd.Max).tolist() == [6.0, -2.0]
    assert hvd.allreduce(x, op=hvd.Product).tolist() == [18.0, 8.0]
    # Scaling: prescale before, postscale after the sum; Average adds 1/size.
    y = torch.ones(4)
    assert hvd.allreduce(y, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist() == [2.0] * 4
    assert hvd.allreduce(y, op=hvd.Average, prescale_factor=3.0).tolist() == [3.0] * 4
    # Integer Average truncates toward zero.
    ints = torch.tensor([1, -1, 2], dtype=torch.int32) * (1 if rank == 0 else 0)
    assert hvd.allreduce(ints, op=hvd.Average).tolist() == [0, 0, 1]
    # 0-dim tensors, positional in-place form, legacy average=.
    assert hvd.allreduce(torch.tensor(float(rank))).item() == pytest.approx(0.5)
    z = torch.full((3,), float(rank + 1))
    same = hvd.allreduce_(z, None, "inplace", hvd.Sum)
    assert same is z
    assert z.tolist() == [3.0] * 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hvd.allreduce(torch.ones(2), average=False).tolist() == [2.0, 2.0]
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)
    # Grouped forms.
    group = [torch.ones(2) * (rank + 1), torch.ones(3, dtype=torch.float64) * 2]
    outs = hvd.grouped_allreduce(group, op=hvd.Sum)
    assert isinstance(outs, list)
    assert outs[0].tolist() == [3.0, 3.0]
    assert outs[1].tolist() == [4.0] * 3
    outs = hvd.synchronize(hvd.grouped_allreduce_async(group, name="grp"))
    assert isinstance(outs, tuple)
    assert outs[0].tolist() == [1.5, 1.5]
    inplace = [torch.ones(2), torch.ones(1)]
    res = hvd.grouped_allreduce_(inplace, op=hvd.Sum)
    assert isinstance(res, tuple)
    assert res[0] is inplace[0]
    assert inplace[1].tolist() == [2.0]
    h = hvd.grouped_allreduce_async_([torch.ones(1)], op=hvd.Max)
    assert hvd.synchronize(h)[0].tolist() == [1.0]
    # Empty tensors and booleans (logical or via Sum, and via Max).
    assert hvd.allreduce(torch.empty(0), name="empty").numel() == 0
    flags = torch.tensor([rank == 0, False])
    assert hvd.allreduce(flags, op=hvd.Max).tolist() == [True, False]
    # Unsupported input.
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce(torch.ones(4, 4).t())
    with pytest.raises(ValueError, match=r"Tensor type torch\.ComplexFloatTensor is not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="Adasum needs floating-point tensors"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(RuntimeError, match="same device"):
        hvd.grouped_allreduce([torch.ones(1), torch.ones(1, device="meta")])


def test_allreduce(ranks2):
    ranks2.run(_allreduce_checks)


def test_allreduce_without_the_socket_mesh(ranks2):
    """Every dtype and op again with rounds and data on gloo (the path large tensors take)."""
    ranks2.run(fresh, {"RINGTRAIN_CONTROL_PLANE": "gloo"})
    try:
        ranks2.run(_allreduce_checks, True)
    finally:
        ranks2.run(fresh)


def _allgather_checks() -> None:
    ensure_init()
    rank = hvd.rank()
    for dtype in MOVE_DTYPES:
        t = (torch.ones(rank + 1, 2) * (rank + 1)).to(dtype)
        out = hvd.allgather(t, name=f"ag.{dtype}")
        assert out.dtype == dtype
        assert out.shape == (3, 2), (dtype, out.shape)
        expected = [[1, 1], [1, 1], [1, 1]] if dtype == torch.bool else [[1, 1], [2, 2], [2, 2]]
        assert out.to(torch.float32).tolist() == expected, dtype
    # Different first dims including an empty contribution.
    t = torch.arange(rank * 3, dtype=torch.float32).reshape(rank * 3, 1)
    assert hvd.allgather(t).view(-1).tolist() == [0.0, 1.0, 2.0]
    outs = hvd.grouped_allgather([torch.ones(1) * rank, torch.ones(rank + 1, 2, dtype=torch.int64)])
    assert isinstance(outs, list)
    assert outs[0].tolist() == [0.0, 1.0]
    assert outs[1].shape == (3, 2)
    outs = hvd.synchronize(hvd.grouped_allgather_async([torch.ones(2)], name="gag"))
    assert isinstance(outs, tuple)
    assert outs[0].shape == (4,)


def test_allgather(ranks2):
    ranks2.run(_allgather_checks)


def _broadcast_checks() -> None:
    ensure_init()
    rank = hvd.rank()
    for dtype in MOVE_DTYPES:
        t = torch.full((2, 3), rank + 1).to(dtype)
        original = t.clone()
        out = hvd.broadcast(t, 1, name=f"bc.{dtype}")
        assert torch.equal(out, torch.full((2, 3), 2).to(dtype)), dtype
        assert torch.equal(t, original), "broadcast must not change its input"
    t = torch.full((3,), float(rank))
    assert hvd.broadcast_(t, 0) is t
    assert t.tolist() == [0.0] * 3
    t = torch.full((3,), float(rank))
    assert hvd.synchronize(hvd.broadcast_async_(t, 1, "bca")) is t
    assert t.tolist() == [1.0] * 3
    assert hvd.synchronize(hvd.broadcast_async(torch.tensor(rank), 0)).item() == 0
    with pytest.raises(ValueError, match="invalid root rank 5"):
        hvd.broadcast(torch.ones(1), 5)


def test_broadcast(ranks2):
    ranks2.run(_broadcast_checks)


def _alltoall_checks() -> None:
    ensure_init()
    rank = hvd.rank()
    for dtype in MOVE_DTYPES:
        t = (torch.arange(4) + 10 * rank).to(dtype)
        out = hvd.alltoall(t, name=f"a2a.{dtype}")
        expected = torch.tensor([0, 1, 10, 11] if rank == 0 else [2, 3, 12, 13]).to(dtype)
        assert torch.equal(out, expected), (dtype, out)
    t = torch.arange(8, dtype=torch.float32).reshape(4, 2) + 100 * rank
    splits = [1, 3] if rank == 0 else [2, 2]
    out, received = hvd.alltoall(t, splits=splits)
    assert received.dtype == torch.int32
    assert received.tolist() == ([1, 2] if rank == 0 else [3, 2])
    assert out.shape == (sum(received.tolist()), 2)
    if rank == 0:
        assert out[:, 0].tolist() == [0.0, 100.0, 102.0]
    out, received = hvd.synchronize(hvd.alltoall_async(t, torch.tensor(splits, dtype=torch.int32)))
    assert received.tolist() == ([1, 2] if rank == 0 else [3, 2])
    with pytest.raises(ValueError, match="not an even multiple"):
        hvd.alltoall(torch.ones(3))
    with pytest.raises(ValueError, match="greater than the first dimension"):
        hvd.alltoall(torch.ones(2), splits=[2, 1])
    with pytest.raises(ValueError, match="32-bit integer"):
        hvd.alltoall(torch.ones(2), splits=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="1D splits"):
        hvd.alltoall(torch.ones(2), splits=torch.ones(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="does not equal number of workers"):
        hvd.alltoall(torch.ones(3), splits=[1, 1, 1])


def test_alltoall(ranks2):
    ranks2.run(_alltoall_checks)


def _reducescatter_checks() -> None:
    ensure_init()
    rank = hvd.rank()
    for dtype in [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64, torch.bfloat16]:
        t = (torch.arange(10).reshape(5, 2) * (rank + 1)).to(dtype)
        out = hvd.reducescatter(t, op=hvd.Sum, name=f"rs.{dtype}")
        full = torch.arange(10).reshape(5, 2) * 3
        # Uneven split: 5 rows over 2 ranks -> rank 0 gets 3 rows, rank 1 gets 2.
        expected = full[:3] if rank == 0 else full[3:]
        assert out.dtype == dtype
        assert torch.equal(out.double(), expected.double()), (dtype, out)
    avg = hvd.reducescatter(torch.ones(4, 1) * (rank + 1))
    assert avg.view(-1).tolist() == [1.5, 1.5]
    scaled = hvd.reducescatter(torch.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)
    assert scaled.tolist() == [12.0]
    outs = hvd.grouped_reducescatter([torch.ones(2), torch.ones(4, 3)], op=hvd.Sum)
    assert outs[0].tolist() == [2.0]
    assert outs[1].shape == (2, 3)
    outs = hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(2)], "grs", hvd.Sum))
    assert isinstance(outs, tuple)
    assert outs[0].tolist() == [2.0]
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        with pytest.raises(RuntimeError, match="only supports AVERAGE and SUM"):
            hvd.reducescatter(torch.ones(2), op=op)


def test_reducescatter(ranks2):
    ranks2.run(_reducescatter_checks)


def _async_checks() -> dict:
    ensure_init()
    tensors = [torch.ones(64) * i for i in range(20)]
    handles = [hvd.allreduce_async(t, name=f"fused.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
    not_ready = sum(not hvd.poll(h) for h in handles)
    results = [hvd.synchronize(h) for h in handles]
    assert all(r.tolist() == (t * 2).tolist() for r, t in zip(results, tensors))
    with pytest.raises(ValueError, match=f"Handle {handles[0]} was not created or has been cleared"):
        hvd.poll(handles[0])
    assert hvd.synchronize(handles[0]) is None
    # Sparse allreduce goes through allgather of indices and values.
    dense = torch.zeros(4, 2)
    dense[hvd.rank()] = 1.0
    fn = hvd.sparse_allreduce_async(dense.to_sparse(), "sparse", hvd.Sum)
    assert torch.equal(fn().to_dense(), torch.tensor([[1.0, 1.0], [1.0, 1.0], [0, 0], [0, 0]]))
    return {"not_ready": not_ready}


def test_async_poll_and_synchronize(ranks2):
    results = ranks2.run(_async_checks)
    assert any(r["not_ready"] > 0 for r in results), "poll() must be False right after submission"


def _out_of_order() -> list[float]:
    ensure_init()
    rank = hvd.rank()
    names = ["a", "b", "c"] if rank == 0 else ["c", "b", "a"]
    handles = {n: hvd.allreduce_async(torch.ones(1) * (ord(n) + rank), name=n, op=hvd.Sum) for n in names}
    return [hvd.synchronize(handles[n]).item() for n in ["a", "b", "c"]]


def test_out_of_order_submission_matches_by_name(ranks2):
    results = ranks2.run(_out_of_order)
    assert results[0] == results[1] == [2 * ord("a") + 1, 2 * ord("b") + 1, 2 * ord("c") + 1]


def _duplicate_name_pattern() -> None:
    """Section 0 of the API notes: rank 0 has the name pending while it waits in barrier().

    Each rank checks its duplicate while the name is pending by construction: the other rank submits
    that name only after the next barrier. (Rank 1 once checked "duplicate_name" itself, which rank 0
    had already submitted, so its first op could complete before the second enqueue: a race.)
    """
    ensure_init()
    rank = hvd.rank()
    tensor = torch.ones(3)
    if rank == 0:
        first = hvd.allreduce_async(tensor, name="duplicate_name")
        with pytest.raises(ValueError, match="same name as another tensor that is currently being processed"):
            for _ in range(3):
                hvd.allreduce_async(tensor, name="duplicate_name")
    hvd.barrier()
    if rank > 0:
        first = hvd.allreduce_async(tensor, name="duplicate_name")
        # Rank 0 submits "duplicate_name_late" only after the barrier below: pending here for sure.
        late = hvd.allreduce_async(tensor, name="duplicate_name_late")
        with pytest.raises(ValueError, match="same name"):
            hvd.allreduce_async(tensor, name="duplicate_name_late")
    hvd.barrier()
    if rank == 0:
        late = hvd.allreduce_async(tensor, name="duplicate_name_late")
    assert hvd.synchronize(first).tolist() == [1.0] * 3
    assert hvd.synchronize(late).tolist() == [1.0] * 3
    # The same user name under another op is a different request.
    h1 = hvd.allgather_async(tensor, name="duplicate_name")
    h2 = hvd.allreduce_async(tensor, name="duplicate_name")
    assert hvd.synchronize(h1).shape == (6,)
    assert hvd.synchronize(h2).shape == (3,)


def test_duplicate_pending_name_raises_at_enqueue(ranks2):
    ranks2.run(_duplicate_name_pattern)


def _reinit_resets_names() -> list[int]:
    fresh()
    rank = hvd.rank()
    if rank == 0:
        # Handles consumed on rank 0 only: unnamed ops would no longer line up without a reset.
        hvd.allreduce_async(torch.ones(1), name="only")
        with pytest.raises(ValueError):
            hvd.allreduce_async(torch.ones(1), name="only")
    hvd.barrier()
    if rank == 1:
        hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="only"))
    hvd.barrier()
    hvd.shutdown()
    hvd.init()
    handle = hvd.allreduce_async(torch.ones(1) * 3)
    assert hvd.synchronize(handle).tolist() == [3.0]
    hvd.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.size()
    hvd.init()
    return [handle, hvd.size()]


def test_reinit_in_same_process_resets_auto_names(ranks2):
    assert ranks2.run(_reinit_resets_names) == [[0, 2], [0, 2]]


def test_signatures_are_horovods():
    """Scripts pass these positionally: the order of parameters is part of the contract."""
    expected = {
        "allreduce": [
            "tensor",
            "average",
            "name",
            "compression",
            "op",
            "prescale_factor",
            "postscale_factor",
            "process_set",
        ],
        "allreduce_async": [
            "tensor",
            "average",
            "name",
            "op",
            "prescale_factor",
            "postscale_factor",
            "process_set",
        ],
        "allreduce_": [
            "tensor",
            "average",
            "name",
            "op",
            "prescale_factor",
            "postscale_factor",
            "process_set",
        ],
        "grouped_allreduce": [
            "tensors",
            "average",
            "name",
            "compression",
            "op",
            "prescale_factor",
            "postscale_factor",
            "process_set",
        ],
        "allgather": ["tensor", "name", "process_set"],
        "broadcast": ["tensor", "root_rank", "name", "process_set"],
        "broadcast_async_": ["tensor", "root_rank", "name", "process_set"],
        "alltoall": ["tensor", "splits", "name", "process_set"],
        "reducescatter": [
            "tensor",
            "name",
            "compression",
            "op",
            "process_set",
            "prescale_factor",
            "postscale_factor",
        ],
        "grouped_reducescatter": [
            "tensors",
            "name",
            "compression",
            "op",
            "process_set",
            "prescale_factor",
            "postscale_factor",
        ],
        "sparse_allreduce_async": ["tensor", "name", "op", "process_set"],
        "init": ["comm", "process_sets"],
        "join": ["device"],
        "barrier": ["process_set"],
        "start_timeline": ["file_path", "mark_cycles"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(hvd, name)).parameters) == params, name
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert inspect.signature(hvd.reducescatter).parameters["op"].default == hvd.Average


def test_queries_work_before_init():
    assert hvd.gloo_built()
    assert hvd.gloo_enabled()
    assert not hvd.mpi_built()
    assert not hvd.mpi_enabled()
    assert not hvd.ccl_built()
    assert not hvd.ddl_built()
    assert hvd.nccl_built() == 0 or hvd.nccl_built() > 2000
    assert hvd.cuda_built() == (torch.version.cuda is not None)


def _cached_path_matches_first_call() -> int:
    """Repeated names take the cached path (small ones ride in the round vector): same numerics."""
    ensure_init(keep_settings=True)
    rank = hvd.rank()
    for dtype in [torch.int32, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.float64]:
        for op, pre, post in [
            (hvd.Sum, 1.0, 1.0),
            (hvd.Average, 1.0, 1.0),
            (hvd.Sum, 0.5, 3.0),
            (hvd.Average, 3.0, 0.5),
        ]:
            t = (torch.tensor([[-7, 5, 3], [1, 0, 9]]) * (rank + 1)).to(dtype)
            results = [
                hvd.allreduce(
                    t, name=f"rep.{dtype}.{op}.{pre}", op=op, prescale_factor=pre, postscale_factor=post
                )
                for _ in range(3)
            ]
            for later in results[1:]:
                assert later.dtype == dtype
                assert torch.allclose(later.double(), results[0].double(), rtol=1e-2), (
                    dtype,
                    op,
                    pre,
                    later,
                    results[0],
                )
    group = [torch.ones(2) * rank, torch.arange(3, dtype=torch.float64)]
    outs = [hvd.grouped_allreduce(group, name="rep.group", op=hvd.Sum) for _ in range(3)]
    assert all(o[0].tolist() == [1.0, 1.0] and o[1].tolist() == [0.0, 2.0, 4.0] for o in outs)
    from ringtrain.engine import state

    return state.require().controller.eager_size


@pytest.mark.parametrize("eager", ["2048", "0"])
def test_cached_path_matches_first_call(ranks2, eager):
    ranks2.run(fresh, {"RINGTRAIN_EAGER_ELEMENTS": eager})
    try:
        eager_elements = ranks2.run(_cached_path_matches_first_call)
        assert (eager_elements[0] > 0) == (eager != "0")
    finally:
        ranks2.run(fresh)


def test_exceptions_are_runtime_errors_with_horovods_names():
    from ringtrain.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    assert issubclass(HorovodInternalError, RuntimeError)
    assert hvd.HorovodInternalError is HorovodInternalError
    assert HostsUpdatedInterrupt(True).skip_sync is True
    assert HostsUpdatedInterrupt().skip_sync is False
    assert isinstance(HostsUpdatedInterrupt(), RuntimeError)
