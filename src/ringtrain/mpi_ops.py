"""Horovod's collectives (``horovod.torch.mpi_ops``) on the ringtrain engine.

Names, positional signatures, defaults, return types and errors follow Horovod 0.28.1, because
scripts and Horovod's own test suite call these positionally. Requests are matched across ranks by
name (``allreduce.<name>``, ``allreduce.noname.<handle>`` when unnamed), not by call order.

This module is the facade: the code lives in :mod:`ringtrain.ops`, one module per op family. The
autograd functions (``HorovodAllreduce`` ...) and ``handle_average_backwards_compatibility`` are
importable from here too, as from Horovod's ``mpi_ops``, without being in ``__all__``.
"""

from __future__ import annotations

from ringtrain.exceptions import HorovodInternalError
from ringtrain.op_requests import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    poll,
    synchronize,
)
from ringtrain.op_requests import (
    handle_average_backwards_compatibility as handle_average_backwards_compatibility,
)
from ringtrain.ops.allgather import HorovodAllgather as HorovodAllgather
from ringtrain.ops.allgather import HorovodGroupedAllgather as HorovodGroupedAllgather
from ringtrain.ops.allgather import (
    allgather,
    allgather_async,
    grouped_allgather,
    grouped_allgather_async,
)
from ringtrain.ops.allreduce import HorovodAllreduce as HorovodAllreduce
from ringtrain.ops.allreduce import HorovodGroupedAllreduce as HorovodGroupedAllreduce
from ringtrain.ops.allreduce import (
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from ringtrain.ops.alltoall import HorovodAlltoall as HorovodAlltoall
from ringtrain.ops.alltoall import alltoall, alltoall_async
from ringtrain.ops.basics import (
    barrier,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ringtrain.ops.broadcast import HorovodBroadcast as HorovodBroadcast
from ringtrain.ops.broadcast import broadcast, broadcast_, broadcast_async, broadcast_async_
from ringtrain.ops.reducescatter import HorovodGroupedReducescatter as HorovodGroupedReducescatter
from ringtrain.ops.reducescatter import HorovodReducescatter as HorovodReducescatter
from ringtrain.ops.reducescatter import (
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from ringtrain.ops.sparse import sparse_allreduce_async
from ringtrain.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set

__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "ProcessSet",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "global_process_set",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
