"""Horovod's collectives (``horovod.torch.mpi_ops``) on the ringtrain engine.

Names, positional signatures, defaults, return types and errors follow Horovod 0.28.1, because
scripts and Horovod's own test suite call these positionally. Requests are matched across ranks by
name (``allreduce.<name>``, ``allreduce.noname.<handle>`` when unnamed), not by call order.
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ringtrain.engine import state
from ringtrain.engine.adasum import DTYPES as ADASUM_DTYPES
from ringtrain.engine.background import Engine
from ringtrain.engine.requests import (
    ADASUM,
    AVERAGE,
    MAX,
    MIN,
    PRODUCT,
    SUM,
    OpType,
    Request,
    RequestMeta,
    dtype_name,
)
from ringtrain.engine.store import rendezvous
from ringtrain.exceptions import HorovodInternalError
from ringtrain.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    register_static,
    remove_process_set,
)

Average, Sum, Adasum, Min, Max, Product = AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT


class _NoneCompressor:
    """Default ``compression=``: identical to ``Compression.none`` (kept here to avoid an import cycle)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


try:
    from ringtrain.compression import Compression as _Compression

    _DEFAULT_COMPRESSION: Any = _Compression.none
except ImportError:  # pragma: no cover - compression.py is part of the package
    _DEFAULT_COMPRESSION = _NoneCompressor

_REDUCE_DTYPES = {
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
}
_MOVE_DTYPES = _REDUCE_DTYPES
_atexit_registered = False
_local = threading.local()


def _sync(async_fn: Callable[..., int], *args: Any) -> Any:
    """Submit and wait: the calling thread runs the negotiation rounds itself (no thread hand-off)."""
    _local.drive = True
    try:
        handle = async_fn(*args)
    finally:
        _local.drive = False
    return synchronize(handle)


# --------------------------------------------------------------------------- lifecycle
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start the engine (rendezvous, control and data groups, background thread).

    A second call while initialized does nothing. ``process_sets`` may be a list of
    :class:`ProcessSet` (registered statically, same list on all ranks) or ``"dynamic"``.
    """
    global _atexit_registered
    if state.engine is not None and not state.engine.stopped:
        return
    if state.engine is not None:
        shutdown()
    if comm is not None:
        if isinstance(comm, (list, tuple, range)):
            # A sub-world would need its own rendezvous; Horovod's gloo path does not offer it either.
            raise NotImplementedError(
                f"init(comm={list(comm)!r}): running Horovod on a subset of the launched ranks is not "
                "supported. HINT: launch only the ranks you need, or use process_sets=[hvd.ProcessSet(...)]."
            )
        raise ValueError(
            "init(comm=<mpi4py communicator>) needs an MPI build of Horovod; ringtrain has none. "
            "HINT: call hvd.init() without comm."
        )
    static: list[ProcessSet] = []
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError(f"init(process_sets={process_sets!r}): the only string accepted is 'dynamic'.")
        state.dynamic_sets = True
    elif process_sets is not None:
        static = list(process_sets)
    try:
        world = rendezvous()
        register_static(static, world.size)
        engine = Engine(world, [ps.ranks for ps in static])
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"Horovod initialization failed: {type(exc).__name__}: {exc}") from exc
    state.engine = engine
    global_process_set.ranks = list(range(world.size))
    global_process_set.process_set_id = 0
    state.registered = {0: global_process_set}
    for set_id, ps in enumerate(static, start=1):
        ps.process_set_id = set_id
        state.registered[set_id] = ps
    timeline = os.environ.get("HOROVOD_TIMELINE", "")
    state.timeline_enabled = "HOROVOD_TIMELINE" in os.environ
    if timeline and timeline != "DYNAMIC" and world.rank == 0:
        engine.timeline.start(timeline, os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "") in ("1", "true"))
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def shutdown() -> None:
    """Stop the engine; afterwards ``init()`` may be called again (auto names restart at 0)."""
    engine = state.engine
    if engine is None:
        return
    state.engine = None
    engine.stop()
    for set_id, ps in list(state.registered.items()):
        if set_id != 0:
            ps.process_set_id = None
    state.registered = {}


def _shutdown_at_exit() -> None:
    engine = state.engine
    if engine is not None:
        state.engine = None
        engine.stop(timeout=10.0)


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return state.engine is not None


def size() -> int:
    """Number of ranks in the job."""
    return state.require().size


def local_size() -> int:
    """Number of ranks on this host."""
    return state.require().world.local_size


def cross_size() -> int:
    """Number of hosts that run this process's local rank."""
    return state.require().world.cross_size


def rank() -> int:
    """This process's global rank."""
    return state.require().rank


def local_rank() -> int:
    """This process's index on its host."""
    return state.require().world.local_rank


def cross_rank() -> int:
    """Index of this host among hosts that run this local rank."""
    return state.require().world.cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return state.require().homogeneous


def mpi_threads_supported() -> bool:
    """False: ringtrain never runs on MPI, so mixing it with another MPI library's threads is not supported.

    Horovod without MPI raises ValueError here; a script asking before it uses mpi4py gets a plain
    answer instead (before ``init()`` too).
    """
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return True


def gloo_built() -> bool:
    return True


def nccl_built() -> int:
    """NCCL version code (e.g. 21903 for 2.19.3), or 0 without CUDA/NCCL."""
    try:
        if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
            return 0
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return 0
    if isinstance(version, tuple):
        major, minor, patch = (list(version) + [0, 0, 0])[:3]
        return (
            major * 10000 + minor * 100 + patch
            if (major, minor) >= (2, 9)
            else major * 1000 + minor * 100 + patch
        )
    return int(version)


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return torch.version.cuda is not None


def rocm_built() -> bool:
    return getattr(torch.version, "hip", None) is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline (rank 0); needs HOROVOD_TIMELINE set at init."""
    engine = state.require()
    if not state.timeline_enabled:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    if engine.rank == 0:
        engine.timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop and close the timeline file."""
    engine = state.require()
    if not state.timeline_enabled:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    engine.timeline.stop()


# --------------------------------------------------------------------------- helpers
def handle_average_backwards_compatibility(op: int | None, average: bool | None) -> int:
    """Horovod's legacy ``average=`` argument."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def _device_index(tensor: torch.Tensor) -> int:
    if tensor.device.type == "cuda":
        return tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    return -1


def _check_tensor(tensor: torch.Tensor, allowed: set[torch.dtype]) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"Expected a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in allowed or tensor.is_sparse:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def _set_members(process_set: ProcessSet, opname: str) -> tuple[Engine, int, list[int]]:
    engine = state.require()
    set_id = process_set.process_set_id
    if set_id is None or set_id not in engine.sets:
        raise ValueError(f"{opname}: Process set provided does not exist, or has not been registered.")
    ranks = engine.sets[set_id].ranks
    if engine.rank not in ranks:
        raise ValueError(f"{opname}: Rank {engine.rank} is not a member of the provided process set.")
    return engine, set_id, ranks


def _names(prefix: str, name: str | None, handle: int, count: int | None) -> tuple[str, ...]:
    base = f"{prefix}.{name}" if name is not None else f"{prefix}.noname.{handle}"
    if count is None:
        return (base,)
    return tuple(f"{base}_{i}of{count}" for i in range(1, count + 1))


def _submit(
    op: OpType,
    prefix: str,
    tensors: Sequence[torch.Tensor],
    outputs: list[torch.Tensor | None],
    name: str | None,
    process_set: ProcessSet,
    finish: Callable[[Request], Any],
    grouped: bool = False,
    reduce_op: int = SUM,
    root: int = -1,
    prescale: float = 1.0,
    postscale: float = 1.0,
    splits: tuple[int, ...] | None = None,
    keepalive: Any = None,
) -> int:
    engine, set_id, _ = _set_members(process_set, prefix.capitalize())
    if len({(t.device.type, _device_index(t)) for t in tensors}) > 1:
        raise RuntimeError("Tensors in list must be on same device.")
    for t in tensors:
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"Tensors on device {t.device} are not supported. HINT: use CPU or CUDA.")
    device = _device_index(tensors[0]) if tensors else -1

    def build(handle: int) -> tuple[RequestMeta, list[torch.Tensor], list[torch.Tensor | None]]:
        names = _names(prefix, name, handle, len(tensors) if grouped else None)
        meta = RequestMeta(
            key=names[0] if not grouped else "|".join(names),
            names=names,
            op=op,
            set_id=set_id,
            dtypes=tuple(dtype_name(t.dtype) for t in tensors),
            shapes=tuple(tuple(t.shape) for t in tensors),
            reduce_op=reduce_op,
            root=root,
            prescale=float(prescale),
            postscale=float(postscale),
            device=device,
            splits=splits,
        )
        return meta, list(tensors), outputs

    return engine.submit(build, finish, keepalive, drive=getattr(_local, "drive", False))


def _first(request: Request) -> torch.Tensor:
    return request.outputs[0]


def _all(request: Request) -> tuple[torch.Tensor, ...]:
    return tuple(request.outputs)


def _control_op(
    op: OpType, key: str, payload: tuple[int, ...] | None, process_set: ProcessSet = global_process_set
) -> Any:
    engine, set_id, _ = _set_members(process_set, op.title)

    def build(handle: int) -> tuple[RequestMeta, list[torch.Tensor], list[torch.Tensor | None]]:
        meta = RequestMeta(key=key, names=(key,), op=op, set_id=set_id, dtypes=(), shapes=(), payload=payload)
        return meta, [], []

    return synchronize(engine.submit(build, lambda request: request.extra.get("result"), drive=True))


# --------------------------------------------------------------------------- allreduce
def _check_reduce(tensor: torch.Tensor, op: int) -> None:
    _check_tensor(tensor, _REDUCE_DTYPES)
    if op == Adasum and tensor.dtype not in ADASUM_DTYPES:
        raise ValueError(
            f"op=hvd.Adasum needs floating-point tensors; got {tensor.dtype}. "
            "HINT: reduce this tensor with op=hvd.Sum or hvd.Average, or convert it with .float()."
        )
    if op not in (Average, Sum, Adasum, Min, Max, Product):
        raise ValueError(
            f"Unknown reduction op {op!r}. HINT: use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product."
        )
    if tensor.dtype == torch.bool and op == Average:
        raise ValueError(
            "Tensor type torch.BoolTensor is not supported with op=Average. "
            "HINT: use op=hvd.Sum (logical or), hvd.Min or hvd.Max."
        )


def _allreduce_async(
    tensor: torch.Tensor,
    output: torch.Tensor,
    name: str | None,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    _check_reduce(tensor, op)
    return _submit(
        OpType.ALLREDUCE,
        "allreduce",
        [tensor],
        [output],
        name,
        process_set,
        _first,
        reduce_op=op,
        prescale=prescale_factor,
        postscale=postscale_factor,
    )


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an out-of-place allreduce; returns a handle for :func:`synchronize`."""
    op = handle_average_backwards_compatibility(op, average)
    _check_reduce(tensor, op)
    output = torch.empty_like(tensor)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the gradient with the same op."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        average: bool | None,
        name: str | None,
        op: int | None,
        prescale_factor: float,
        postscale_factor: float,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.op = handle_average_backwards_compatibility(op, average)
        ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = (
            prescale_factor,
            postscale_factor,
            process_set,
        )
        return _sync(
            allreduce_async, tensor, None, name, ctx.op, prescale_factor, postscale_factor, process_set
        )

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad = allreduce(
            grad_output.contiguous(),
            None,
            None,
            _NoneCompressor,
            ctx.op,
            ctx.prescale_factor,
            ctx.postscale_factor,
            ctx.process_set,
        )
        return grad, None, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = _DEFAULT_COMPRESSION,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over the set and return a new tensor (differentiable; input unchanged)."""
    op = handle_average_backwards_compatibility(op, average)
    compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(
        compressed, None, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(summed, ctx)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place allreduce (the input becomes the output)."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place allreduce; returns ``tensor``."""
    return _sync(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def _grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    outputs: list[torch.Tensor | None],
    name: str | None,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    for t in tensors:
        _check_reduce(t, op)
    return _submit(
        OpType.ALLREDUCE,
        "allreduce",
        list(tensors),
        outputs,
        name,
        process_set,
        _all,
        grouped=True,
        reduce_op=op,
        prescale=prescale_factor,
        postscale=postscale_factor,
    )


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an atomic group of out-of-place allreduces; synchronize returns a tuple."""
    op = handle_average_backwards_compatibility(op, average)
    outputs: list[torch.Tensor | None] = [torch.empty_like(t) for t in tensors]
    return _grouped_allreduce_async(
        tensors, outputs, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place grouped allreduce (async)."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(
        tensors, list(tensors), name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> tuple[torch.Tensor, ...]:
    """In-place grouped allreduce; returns a tuple of the input tensors."""
    return _sync(
        grouped_allreduce_async_, tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Differentiable grouped allreduce."""

    @staticmethod
    def forward(
        ctx: Any,
        average: bool | None,
        name: str | None,
        op: int | None,
        prescale_factor: float,
        postscale_factor: float,
        process_set: ProcessSet,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.op = handle_average_backwards_compatibility(op, average)
        ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = (
            prescale_factor,
            postscale_factor,
            process_set,
        )
        return _sync(
            grouped_allreduce_async,
            list(tensors),
            None,
            name,
            ctx.op,
            prescale_factor,
            postscale_factor,
            process_set,
        )

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        grads = grouped_allreduce(
            [g.contiguous() for g in grad_outputs],
            None,
            None,
            _NoneCompressor,
            ctx.op,
            ctx.prescale_factor,
            ctx.postscale_factor,
            ctx.process_set,
        )
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = _DEFAULT_COMPRESSION,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Allreduce every tensor of the list as one atomic group (differentiable); returns a list."""
    op = handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    outputs = HorovodGroupedAllreduce.apply(
        None, name, op, prescale_factor, postscale_factor, process_set, *[t for t, _ in pairs]
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outputs, pairs)]


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None, op: int, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Allreduce a sparse COO tensor by allgathering indices and values; returns a zero-arg function
    that waits and gives the coalesced sum (or average). See :mod:`ringtrain.sparse`."""
    from ringtrain.sparse import sparse_allreduce_async as start

    return start(tensor, name, op, process_set)


# --------------------------------------------------------------------------- allgather
def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start an allgather (dim 0 may differ per rank); returns a handle."""
    _check_tensor(tensor, _MOVE_DTYPES)
    return _submit(OpType.ALLGATHER, "allgather", [tensor], [None], name, process_set, _first)


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather: averaged gradient, this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        return _sync(allgather_async, tensor, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int32), process_set=ctx.process_set)
        me = ctx.process_set.rank()
        offset = int(dims[:me].sum().item())
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0, in set-rank order (differentiable)."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start a group of allgathers; synchronize returns a tuple."""
    for t in tensors:
        _check_tensor(t, _MOVE_DTYPES)
    return _submit(
        OpType.ALLGATHER,
        "allgather",
        list(tensors),
        [None] * len(tensors),
        name,
        process_set,
        _all,
        grouped=True,
    )


class HorovodGroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather."""

    @staticmethod
    def forward(
        ctx: Any, name: str | None, process_set: ProcessSet, *tensors: torch.Tensor
    ) -> tuple[Any, ...]:
        ctx.dims = [t.shape[0] if t.dim() > 0 else 0 for t in tensors]
        ctx.process_set = process_set
        return _sync(grouped_allgather_async, list(tensors), name, process_set)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        reduced = grouped_allreduce(
            [g.contiguous() for g in grad_outputs], op=Average, process_set=ctx.process_set
        )
        dims = allgather(torch.tensor(ctx.dims, dtype=torch.int32).view(1, -1), process_set=ctx.process_set)
        me = ctx.process_set.rank()
        grads = []
        for i, (grad, dim) in enumerate(zip(reduced, ctx.dims)):
            offset = int(dims[:me, i].sum().item())
            grads.append(grad.narrow(0, offset, dim))
        return (None, None, *grads)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather every tensor of the list as one group (differentiable); returns a list."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# --------------------------------------------------------------------------- broadcast
def _broadcast_async(
    tensor: torch.Tensor,
    output: torch.Tensor | None,
    root_rank: int,
    name: str | None,
    process_set: ProcessSet,
) -> int:
    _check_tensor(tensor, _MOVE_DTYPES)
    engine = state.require()
    set_id = process_set.process_set_id
    ranks = engine.sets[set_id].ranks if set_id in engine.sets else []
    if set_id in engine.sets and (not isinstance(root_rank, int) or root_rank not in ranks):
        raise ValueError(f"broadcast received invalid root rank {root_rank} for provided process set")
    return _submit(
        OpType.BROADCAST, "broadcast", [tensor], [output], name, process_set, _first, root=root_rank
    )


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an out-of-place broadcast from global rank ``root_rank``."""
    return _broadcast_async(tensor, None, root_rank, name, process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place broadcast."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place broadcast; returns ``tensor``."""
    return _sync(broadcast_async_, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast: averaged gradient on the root, zeros elsewhere."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _sync(broadcast_async, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return the root's tensor on every rank; the input is unchanged (differentiable)."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# --------------------------------------------------------------------------- alltoall
def _alltoall_splits(tensor: torch.Tensor, splits: Any, set_size: int) -> tuple[int, ...]:
    if splits is None:
        if tensor.dim() == 0:
            return (0,) * set_size
        if tensor.shape[0] % set_size != 0:
            raise ValueError(
                "splits not provided, but first dimension of tensor is not an even multiple of the "
                "number of workers."
            )
        return (tensor.shape[0] // set_size,) * set_size
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
        if splits.dim() != 1:
            raise ValueError("alltoall expects a 1D splits tensor")
        values = [int(v) for v in splits.cpu().tolist()]
    else:
        values = [int(v) for v in splits]
    if len(values) != set_size:
        raise ValueError("Number of entries in splits does not equal number of workers.")
    if any(v < 0 for v in values):
        raise ValueError(f"alltoall splits must not be negative; got {values}.")
    if tensor.dim() > 0 and sum(values) > tensor.shape[0]:
        raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
    return tuple(values)


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an alltoall; synchronize returns ``(output, received_splits)``."""
    _check_tensor(tensor, _MOVE_DTYPES)
    _, _, ranks = _set_members(process_set, "Alltoall")
    values = _alltoall_splits(tensor, splits, len(ranks))
    splits_device = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")

    def finish(request: Request) -> tuple[torch.Tensor, torch.Tensor]:
        received = torch.tensor(request.extra["received_splits"], dtype=torch.int32, device=splits_device)
        return request.outputs[0], received

    return _submit(OpType.ALLTOALL, "alltoall", [tensor], [None], name, process_set, finish, splits=values)


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: gradients go back to their senders."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None, process_set: ProcessSet
    ) -> tuple[torch.Tensor, torch.Tensor]:
        output, received_splits = _sync(alltoall_async, tensor, splits, name, process_set)
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, grad_received_splits: Any) -> tuple[Any, ...]:
        grad, _ = _sync(alltoall_async, grad_output.contiguous(), ctx.recvsplits, None, ctx.process_set)
        return grad, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send ``splits[i]`` rows to set-rank i; returns output, or ``(output, received_splits)`` with splits."""
    output, received_splits = HorovodAlltoall.apply(tensor, splits, name, process_set)
    if splits is None:
        return output
    return output, received_splits


# --------------------------------------------------------------------------- reducescatter
def _check_reducescatter(tensor: torch.Tensor, op: int) -> None:
    _check_tensor(tensor, _REDUCE_DTYPES - {torch.bool})
    if op not in (Average, Sum):
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start a reducescatter (rank r of the set gets its dim-0 slice of the reduction)."""
    _check_reducescatter(tensor, op)
    return _submit(
        OpType.REDUCESCATTER,
        "reducescatter",
        [tensor],
        [None],
        name,
        process_set,
        _first,
        reduce_op=op,
        prescale=prescale_factor,
        postscale=postscale_factor,
    )


class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter: the gradient is the allgather of the gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: str | None,
        op: int,
        process_set: ProcessSet,
        prescale_factor: float,
        postscale_factor: float,
    ) -> torch.Tensor:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _sync(reducescatter_async, tensor, name, op, process_set, prescale_factor, postscale_factor)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        return _reducescatter_grad(grad, ctx), None, None, None, None, None


def _reducescatter_grad(grad: torch.Tensor, ctx: Any) -> torch.Tensor:
    if ctx.op == Sum:
        grad = grad * ctx.process_set.size()
    if ctx.prescale_factor != 1.0:
        grad = grad * ctx.prescale_factor
    if ctx.postscale_factor != 1.0:
        grad = grad * ctx.postscale_factor
    return grad


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = _DEFAULT_COMPRESSION,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce over the set and return this rank's dim-0 slice (differentiable)."""
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start a group of reducescatters; synchronize returns a tuple."""
    for t in tensors:
        _check_reducescatter(t, op)
    return _submit(
        OpType.REDUCESCATTER,
        "reducescatter",
        list(tensors),
        [None] * len(tensors),
        name,
        process_set,
        _all,
        grouped=True,
        reduce_op=op,
        prescale=prescale_factor,
        postscale=postscale_factor,
    )


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Differentiable grouped reducescatter."""

    @staticmethod
    def forward(
        ctx: Any,
        name: str | None,
        op: int,
        process_set: ProcessSet,
        prescale_factor: float,
        postscale_factor: float,
        *tensors: torch.Tensor,
    ) -> tuple[Any, ...]:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _sync(
            grouped_reducescatter_async,
            list(tensors),
            name,
            op,
            process_set,
            prescale_factor,
            postscale_factor,
        )

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        grads = grouped_allgather([g.contiguous() for g in grad_outputs], process_set=ctx.process_set)
        return (None, None, None, None, None, *[_reducescatter_grad(g, ctx) for g in grads])


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = _DEFAULT_COMPRESSION,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatter every tensor of the list as one group (differentiable); returns a list."""
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor, *[t for t, _ in pairs]
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outs, pairs)]


# --------------------------------------------------------------------------- sync
def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (never blocks)."""
    engine = state.require()
    entry = engine.handles.get(handle)
    if entry is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return entry.done.is_set()


def synchronize(handle: int) -> Any:
    """Wait for ``handle`` and return its output (tensor, tuple, (output, splits), int or None)."""
    engine = state.engine
    if engine is None:
        return None
    entry = engine.handles.get(handle)
    if entry is None:
        return None
    engine.wait(handle)
    engine.handles.discard(handle)
    if entry.error is not None:
        raise (entry.error_type or HorovodInternalError)(entry.error)
    if entry.finish is not None:
        return entry.finish(entry.outputs)
    return entry.outputs


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every member of the set has called barrier."""
    _control_op(OpType.BARRIER, "barrier", None, process_set)


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; wait for all ranks; return the last rank to join.

    While joined, this rank takes part in other ranks' allreduces with zeros. ``device`` is accepted
    for compatibility (zeros are made on the device of the data being reduced).
    """
    engine = state.require()
    return synchronize(engine.join())


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
