"""From a Horovod call to an engine request and back: argument checks, names, submission, handles.

Every op family builds its requests with :func:`submit`; :func:`poll` and :func:`synchronize` wait on
the handles. Requests are matched across ranks by name (``allreduce.<name>``,
``allreduce.noname.<handle>`` when unnamed), not by call order. The op families of
:mod:`ringtrain.ops` use these helpers, and so does :mod:`ringtrain.process_sets`, which builds its own
control requests on them; nothing here imports either.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import torch

from ringtrain.engine import state
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
from ringtrain.exceptions import HorovodInternalError

Average, Sum, Adasum, Min, Max, Product = AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT


class ProcessSetLike(Protocol):
    """What the request helpers need of a :class:`ProcessSet`: its registration id (structural, so
    that ``process_sets`` can use them without the helpers importing it back)."""

    process_set_id: int | None


REDUCE_DTYPES = {
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
MOVE_DTYPES = REDUCE_DTYPES


_local = threading.local()


def run_sync(async_fn: Callable[..., int], *args: Any) -> Any:
    """Submit and wait: the calling thread runs the negotiation rounds itself (no thread hand-off)."""
    _local.drive = True
    try:
        handle = async_fn(*args)
    finally:
        _local.drive = False
    return synchronize(handle)


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


def check_tensor(tensor: torch.Tensor, allowed: set[torch.dtype]) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"Expected a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in allowed or tensor.is_sparse:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def set_members(process_set: ProcessSetLike, opname: str) -> tuple[Engine, int, list[int]]:
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


def submit(
    op: OpType,
    prefix: str,
    tensors: Sequence[torch.Tensor],
    outputs: list[torch.Tensor | None],
    name: str | None,
    process_set: ProcessSetLike,
    finish: Callable[[Request], Any],
    grouped: bool = False,
    reduce_op: int = SUM,
    root: int = -1,
    prescale: float = 1.0,
    postscale: float = 1.0,
    splits: tuple[int, ...] | None = None,
    keepalive: Any = None,
) -> int:
    engine, set_id, _ = set_members(process_set, prefix.capitalize())
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


def first_output(request: Request) -> torch.Tensor:
    # a finished request has every output filled (an output is None only until its op has run)
    return cast(torch.Tensor, request.outputs[0])


def all_outputs(request: Request) -> tuple[torch.Tensor, ...]:
    return tuple(cast("list[torch.Tensor]", request.outputs))


def control_op(op: OpType, key: str, payload: tuple[int, ...] | None, process_set: ProcessSetLike) -> Any:
    engine, set_id, _ = set_members(process_set, op.title)

    def build(handle: int) -> tuple[RequestMeta, list[torch.Tensor], list[torch.Tensor | None]]:
        meta = RequestMeta(key=key, names=(key,), op=op, set_id=set_id, dtypes=(), shapes=(), payload=payload)
        return meta, [], []

    return synchronize(engine.submit(build, lambda request: request.extra.get("result"), drive=True))


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (never blocks)."""
    engine = state.require()
    entry = engine.handles.get(handle)
    if entry is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return entry.done.is_set()


def synchronize(handle: int) -> Any:
    """Wait for ``handle`` and return its output (tensor, tuple, (output, splits), int or None).

    A handle already synchronized gives None, as in Horovod; one that no call of this ``init()``
    returned is refused.
    """
    engine = state.engine
    if engine is None:
        return None
    entry = engine.handles.get(handle)
    if entry is None:
        if not engine.handles.issued(handle):
            raise ValueError(
                f"synchronize({handle!r}): no operation was started with this handle. HINT: pass a "
                "handle returned by an *_async call since the last hvd.init() (handles restart at 0 "
                "after hvd.shutdown())."
            )
        return None
    engine.wait(handle)
    engine.handles.discard(handle)
    if entry.error is not None:
        raise (entry.error_type or HorovodInternalError)(entry.error)
    if entry.finish is not None:
        return entry.finish(entry.outputs)
    return entry.outputs
