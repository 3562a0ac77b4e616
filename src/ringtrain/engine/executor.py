"""Running agreed responses on the data process groups, identically ordered on every rank.

Gloo has no AVERAGE: an average is a SUM followed by scaling with 1/set size. Scaling follows
Horovod's CPU numerics: integers are scaled in float64 and truncated toward zero, half precision is
scaled in float32. Allgather, broadcast and alltoall move raw bytes (``view(torch.uint8)``) so that
every dtype works whatever the backend supports.

CUDA tensors run on NCCL, each rank on its own GPU: a response names the device of its lowest rank,
so every allocation, stream and synchronization here uses this rank's own device
(:func:`local_device`). Where two members of a set share one GPU, which NCCL refuses ("Duplicate GPU
detected"), the set's CUDA collectives run on host copies over the CPU paths instead
(:func:`transport_device`). A CUDA collective is complete on this rank's device when its handle
completes, whatever stream the caller reads it on (:func:`_settle`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ringtrain.engine import hierarchical, liveness
from ringtrain.engine.control_plane import ControlPlaneError
from ringtrain.engine.requests import (
    ADASUM,
    AVERAGE,
    MAX,
    MIN,
    PRODUCT,
    SUM,
    OpType,
    Request,
    Response,
    dtype_from_name,
)
from ringtrain.engine.socket_ring import ring_allreduce

log = logging.getLogger("ringtrain.engine")

_REDUCE_OPS = {MIN: dist.ReduceOp.MIN, MAX: dist.ReduceOp.MAX, PRODUCT: dist.ReduceOp.PRODUCT}
_INTEGER = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
_HALF = {torch.float16, torch.bfloat16}
#: Elementwise reduction of two parts, for the reductions done here rather than by gloo (the mesh and
#: the socket ring); each takes ``out=``. Average is a Sum scaled afterwards.
COMBINE: dict[int, Callable[..., torch.Tensor]] = {
    SUM: torch.add, AVERAGE: torch.add, MIN: torch.minimum, MAX: torch.maximum, PRODUCT: torch.mul}
#: Gathered bytes (all ranks together) up to which a CPU allreduce of the global set uses the
#: control plane's socket mesh instead of gloo.
MESH_ALLREDUCE_BYTES = 1024 * 1024
#: Dtypes gloo cannot reduce, and the wider type used on the wire instead.
_WIRE_DTYPE = {torch.int16: torch.int32}


@dataclass
class SetGroups:
    """The data groups of one process set on this process (None where this process is not a member)."""

    set_id: int
    ranks: list[int]
    gloo: Any
    make_nccl: Callable[[], Any]
    nccl: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The control plane, for CPU allreduces over its sockets; see :func:`mesh_fits`.
    plane: Any = None
    #: Whether CPU allreduces too large for the mesh run as a ring over the plane (else on gloo).
    ring: bool = False
    #: Shared memory for the CPU allreduces of a set of every rank, all on one host (else None).
    shm: Any = None
    #: Fusion buffers by (dtype, device), shared by the engine's sets (see :func:`_fusion_buffer`).
    buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = field(default_factory=dict)
    #: Largest fusion buffer kept between batches (HOROVOD_FUSION_THRESHOLD).
    keep_bytes: int = 128 * 1024 * 1024
    #: The engine's abort: waits on this set's gloo work end once a peer is declared failed.
    abort: liveness.Abort = field(default_factory=liveness.Abort)

    def group(self, device: int) -> Any:
        if device < 0:
            return self.gloo
        if self.nccl is None:
            # Created lazily, at the same point of the agreed order on every member.
            self.nccl = self.make_nccl()
        return self.nccl


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place with Horovod's per-dtype numerics."""
    if factor == 1.0 or tensor.numel() == 0:
        return
    if tensor.dtype in _INTEGER:
        tensor.copy_((tensor.to(torch.float64) * factor).trunc())
    elif tensor.dtype in _HALF:
        # Half-precision kernels compute in float32 and round once: the same result as scaling a
        # float32 copy, without the two extra passes.
        tensor.mul_(factor)
    elif tensor.dtype == torch.bool:
        tensor.copy_(tensor.to(torch.float64) * factor != 0)
    else:
        tensor.mul_(factor)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _device(meta_device: int) -> torch.device:
    return torch.device("cpu") if meta_device < 0 else torch.device("cuda", meta_device)


def _wait(work: Any, device: int, groups: SetGroups) -> None:
    if device >= 0:
        work.wait()
        torch.cuda.current_stream(device).synchronize()
        return
    liveness.wait_on_group(work, groups.gloo, groups.abort)


def _wait_inputs(requests: list[Request | None]) -> None:
    for request in requests:
        if request is not None and request.ready_events:
            # The communication stream waits for the producer stream recorded at enqueue time.
            for event in request.ready_events:
                torch.cuda.current_stream(request.meta.device).wait_event(event)


def _settle(device: int) -> None:
    """Wait until this rank's device has finished the collective's last kernels (scaling, copies out).

    They run on the engine thread's stream, so a caller reading the result on another stream (a
    ``torch.cuda.stream`` block, autograd's) would otherwise race them; Horovod's handles complete
    only once the GPU work is done, too.
    """
    if device >= 0:
        torch.cuda.current_stream(device).synchronize()


def local_device(ref_device: int, requests: Sequence[Request | None], groups: SetGroups) -> int:
    """This rank's device for a response whose reference (lowest) rank used ``ref_device``.

    Ranks may use different GPUs (rank r on ``cuda:r``): the response's device index is only the
    reference rank's. A rank with a request of its own uses its device; a joined rank (no tensors)
    uses the GPU of its last CUDA request in this set, else the one its local rank pins.
    """
    if ref_device < 0:
        return -1
    for request in requests:
        if request is not None:
            groups.extra["cuda_device"] = request.meta.device
            return request.meta.device
    known = groups.extra.get("cuda_device")
    if known is None:
        hierarchy = groups.extra.get("hierarchy")
        local_rank = hierarchy.world.local_rank if hierarchy is not None else 0
        known = local_rank % max(1, torch.cuda.device_count())
    return known


def transport_device(device: int, groups: SetGroups) -> int:
    """Where a collective of this rank's ``device`` runs: that GPU (NCCL), or -1 (host memory, the
    CPU paths) for CUDA tensors of a set whose members share a GPU, which NCCL refuses."""
    if device < 0 or not shares_gpu(groups, device):
        return device
    return -1


def gpu_identity(device: int) -> str:
    """What tells one physical GPU from another, across processes and hosts (its UUID)."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return str(uuid)
    # torch builds without the UUID: the PCI address on this host
    pci = [getattr(props, name, "?") for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    return f"{socket.gethostname()}/{pci}/{props.name}"


def shares_gpu(groups: SetGroups, device: int) -> bool:
    """Whether two members of the set use one GPU (several ranks per GPU on a machine short of GPUs).

    Decided once per set, at its first CUDA collective: the same point of the agreed order on every
    member, as the NCCL group's lazy creation is. One allgather of 16-byte digests on the set's gloo
    group.
    """
    shared = groups.extra.get("shares_gpu")
    if shared is None:
        shared = False
        if len(groups.ranks) > 1:
            digest = hashlib.sha256(gpu_identity(device).encode()).digest()[:16]
            mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
            rows = [torch.empty(16, dtype=torch.uint8) for _ in groups.ranks]
            liveness.wait_on_group(groups.gloo.allgather([rows], [mine]), groups.gloo, groups.abort)
            shared = len({bytes(row.tolist()) for row in rows}) < len(rows)
        groups.extra["shares_gpu"] = shared
        if shared and groups.extra.get("set_rank") == 0:
            log.warning(
                "ranks %s share GPUs: NCCL refuses two ranks on one GPU, so CUDA collectives of this "
                "process set go through host memory (gloo and ringtrain's CPU paths), at CPU speed. HINT: "
                "start at most one rank per GPU (-np no more than the GPUs of each host) for NCCL.",
                groups.ranks)
    return shared


def run_allreduce(batch: list[tuple[Response, Request | None]], groups: SetGroups) -> None:
    """One (possibly fused) allreduce over the set; joined ranks contribute zeros."""
    ref = batch[0][0].reference
    dtype = dtype_from_name(ref.dtypes[0])
    requests = [req for _, req in batch]
    local = local_device(ref.device, requests, groups)
    device = _device(local)
    _wait_inputs(requests)
    single = len(batch) == 1 and len(ref.shapes) == 1 and batch[0][1] is not None
    total = sum(math.prod(shape) for response, _ in batch for shape in response.reference.shapes)
    arena = _shared_arena(groups, ref, local, dtype, total)
    if single:
        request = batch[0][1]
        assert request is not None
        out = request.outputs[0]
        if out is None:
            out = request.outputs[0] = torch.empty_like(request.inputs[0])
        if out is not request.inputs[0]:
            out.copy_(request.inputs[0])
        buffer = out.reshape(-1)
    else:
        if arena is not None:
            buffer = arena.buffer(dtype, total)  # the fused inputs go straight into shared memory
        else:
            buffer = _fusion_buffer(groups, dtype, device, total)
        offset = 0
        for response, request in batch:
            for i, shape in enumerate(response.reference.shapes):
                n = math.prod(shape)
                if request is None:
                    buffer[offset : offset + n].zero_()
                else:
                    buffer[offset : offset + n].copy_(request.inputs[i].reshape(-1))
                offset += n
    scale_(buffer, ref.prescale)
    post = ref.postscale / len(groups.ranks) if ref.reduce_op == AVERAGE else ref.postscale
    if arena is not None:
        # Each rank scales only the chunk it reduced: one pass over 1/n of the buffer, not all of it.
        # A fused result goes from the segments straight into the outputs (no gather into buffer).
        deliver = None if single else _unfuser(batch)
        arena.allreduce(buffer, COMBINE[ref.reduce_op], lambda chunk: scale_(chunk, post), deliver)
        _settle(local)
        return
    via = transport_device(local, groups)
    wire = buffer if via == local else buffer.cpu()
    if dtype in _WIRE_DTYPE:
        wire = wire.to(_WIRE_DTYPE[dtype])
    if wire.numel() > 0:
        hierarchy: hierarchical.Hierarchy | None = groups.extra.get("hierarchy")
        if ref.reduce_op == ADASUM:
            assert hierarchy is not None, "every member's set has a hierarchy (EngineGroups.add_set)"
            counts = [math.prod(shape) for response, _ in batch for shape in response.reference.shapes]
            if ref.device >= 0:
                # CUDA tensors follow Horovod's NCCL build (averaged within each host first), also
                # when they travel through host memory.
                hierarchical.adasum(hierarchy, wire.reshape(-1), counts, via)
            else:
                hierarchical.adasum_over_set(hierarchy, wire.reshape(-1), counts, via)
        elif hierarchy is not None and hierarchy.applies_to_allreduce():
            torch_op = _REDUCE_OPS.get(ref.reduce_op, dist.ReduceOp.SUM)
            hierarchical.allreduce(hierarchy, wire.reshape(-1), COMBINE[ref.reduce_op], torch_op, via)
        elif via < 0 and mesh_fits(groups, wire):
            mesh_allreduce(groups.plane, wire, ref.reduce_op)
        elif via < 0 and groups.ring:
            ring_allreduce(groups.plane, groups.ranks, wire.reshape(-1), COMBINE[ref.reduce_op])
        else:
            opts = dist.AllreduceOptions()
            # torch's stubs type ReduceOp.SUM as a RedOpType, which the reduceOp setter takes as a ReduceOp
            opts.reduceOp = _REDUCE_OPS.get(ref.reduce_op, dist.ReduceOp.SUM)  # type: ignore[assignment]
            _wait(groups.group(via).allreduce([wire], opts), via, groups)
    if wire is not buffer:
        buffer.copy_(wire)
    scale_(buffer, post)
    if not single:
        _unfuser(batch)(0, buffer)
    _settle(local)


def _unfuser(batch: list[tuple[Response, Request | None]]) -> Callable[[int, torch.Tensor], None]:
    """``unfuse(start, piece)``: copies elements ``start:start + len(piece)`` of a fused result into
    the outputs they belong to (allocated here where the request has none)."""
    spans: list[tuple[int, int, torch.Tensor]] = []  # (offset, numel, flat output) in fused order
    offset = 0
    for response, request in batch:
        for i, shape in enumerate(response.reference.shapes):
            n = math.prod(shape)
            if request is not None:
                out = request.outputs[i]
                if out is None:
                    out = request.outputs[i] = torch.empty_like(request.inputs[i])
                spans.append((offset, n, out.reshape(-1)))
            offset += n

    def unfuse(start: int, piece: torch.Tensor) -> None:
        end = start + piece.numel()
        for offset, n, out in spans:
            lo, hi = max(offset, start), min(offset + n, end)
            if lo < hi:
                out[lo - offset : hi - offset].copy_(piece[lo - start : hi - start])

    return unfuse


def _shared_arena(groups: SetGroups, ref: Any, local: int, dtype: torch.dtype, numel: int) -> Any:
    """The set's shared-memory arena when this allreduce goes through it, else None.

    Only agreed values decide (the same on every rank), and :meth:`SharedArena.fits` is collective:
    every member asks at the same point of the agreed order. Small tensors keep the socket mesh (one
    exchange instead of the arena's three barriers); Adasum, the hierarchical allreduce and dtypes
    widened on the wire keep their own paths.
    """
    arena = groups.shm
    if (arena is None or numel == 0 or ref.reduce_op == ADASUM or dtype in _WIRE_DTYPE
            or transport_device(local, groups) >= 0):
        return None
    hierarchy = groups.extra.get("hierarchy")
    if hierarchy is not None and hierarchy.applies_to_allreduce():
        return None
    nbytes = numel * dtype.itemsize
    if mesh_fits_bytes(groups, nbytes):
        return None
    return arena if arena.fits(nbytes) else None


def _fusion_buffer(groups: SetGroups, dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
    """A flat buffer of ``numel`` elements, kept for the next batch (one engine thread uses it at a time).

    A fresh tensor of tens of MB costs the kernel's page faults on every step (measured: 9 ms of a
    26 MB fusion on the 2-core VM, four times the copy itself); Horovod keeps its fusion buffer too.
    It grows to the largest batch seen up to HOROVOD_FUSION_THRESHOLD; a larger batch (one grouped
    request can exceed the threshold) gets a buffer of its own that is not kept.
    """
    if numel * dtype.itemsize > groups.keep_bytes:
        return torch.empty(numel, dtype=dtype, device=device)
    key = (dtype, device)
    held = groups.buffers.get(key)
    if held is None or held.numel() < numel:
        groups.buffers.pop(key, None)  # free the old one before allocating the larger
        held = groups.buffers[key] = torch.empty(numel, dtype=dtype, device=device)
    return held[:numel]


def mesh_fits(groups: SetGroups, wire: torch.Tensor) -> bool:
    """Whether a CPU allreduce of ``wire`` goes over the control plane's sockets.

    Every rank sends its whole tensor to every other rank and reduces locally, so the bytes moved grow
    with the world size: worth it while latency dominates (small tensors, small worlds), where it
    skips gloo's I/O-thread hand-offs. The test depends only on agreed values, so all ranks choose
    the same way.
    """
    return mesh_fits_bytes(groups, wire.numel() * wire.element_size())


def mesh_fits_bytes(groups: SetGroups, nbytes: int) -> bool:
    """:func:`mesh_fits` for a tensor of ``nbytes``."""
    plane = groups.plane
    if plane is None or len(groups.ranks) != plane.size:
        return False
    return nbytes <= plane.max_message and nbytes * plane.size <= MESH_ALLREDUCE_BYTES


def mesh_allreduce(plane: Any, wire: torch.Tensor, reduce_op: int) -> None:
    """Allreduce ``wire`` in place over the socket mesh, reducing in rank order on every rank.

    The same inputs in the same order give bit-identical results everywhere, as a ring would.
    """
    flat = wire.reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    rows = plane.allgather(flat.view(torch.uint8).numpy().data)
    if any(len(row) != nbytes for row in rows):
        # Every rank derives the length from agreed state: a mismatch means a message that is not
        # this exchange's (a bug, or something else writing to the sockets).
        lengths = [len(row) for row in rows]
        raise ControlPlaneError(f"allreduce parts differ in length across ranks: {lengths} bytes")
    dtype = wire.dtype
    parts = [torch.frombuffer(row, dtype=dtype) if r != plane.rank else flat for r, row in enumerate(rows)]
    flat.copy_(reduce_in_rank_order(parts, reduce_op))


def reduce_in_rank_order(parts: Sequence[torch.Tensor], reduce_op: int) -> torch.Tensor:
    """Every rank's part combined in rank order (a new tensor): same result on every rank."""
    combine = COMBINE.get(reduce_op, torch.add)
    total = combine(parts[0], parts[1])
    for part in parts[2:]:
        total = combine(total, part)
    return total


def run_allgather(response: Response, request: Request, groups: SetGroups) -> None:
    """Concatenate along dim 0 in set order; ranks may have different first dimensions."""
    _wait_inputs([request])
    hierarchy = groups.extra.get("hierarchy")
    if hierarchy is not None and hierarchy.applies_to_allgather():
        hierarchical.run_allgather(hierarchy, response, request)
        return
    device = request.meta.device  # this rank's (the reference rank may use another GPU)
    pg = groups.group(device)
    for i, tensor in enumerate(request.inputs):
        rows = [response.metas[r].shapes[i][0] for r in groups.ranks]
        row_shape = tuple(tensor.shape[1:])
        row_bytes = math.prod(row_shape) * tensor.element_size()
        width = max(rows) * row_bytes
        out = torch.empty((sum(rows), *row_shape), dtype=tensor.dtype, device=tensor.device)
        if width > 0:
            send = torch.zeros(width, dtype=torch.uint8, device=tensor.device)
            send[: tensor.numel() * tensor.element_size()].copy_(_bytes(tensor))
            recv = [torch.empty(width, dtype=torch.uint8, device=tensor.device) for _ in groups.ranks]
            _wait(pg.allgather([recv], [send]), device, groups)
            out_bytes = _bytes(out)
            offset = 0
            for count, chunk in zip(rows, recv):
                out_bytes[offset : offset + count * row_bytes].copy_(chunk[: count * row_bytes])
                offset += count * row_bytes
        request.outputs[i] = out


def run_broadcast(response: Response, request: Request, groups: SetGroups) -> None:
    """Everyone gets the root's tensor (root given as a global rank)."""
    _wait_inputs([request])
    ref = response.reference
    root = groups.ranks.index(ref.root)
    device = request.meta.device
    pg = groups.group(device)
    for i, tensor in enumerate(request.inputs):
        out = request.outputs[i]
        if out is None:
            out = request.outputs[i] = tensor.clone()
        elif out is not tensor:
            out.copy_(tensor)
        if out.numel() == 0:
            continue
        payload = _bytes(out)
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        _wait(pg.broadcast([payload], opts), device, groups)


def run_alltoall(response: Response, request: Request, groups: SetGroups) -> None:
    """Scatter rows by ``splits``; also produces ``received_splits``."""
    _wait_inputs([request])
    tensor = request.inputs[0]
    my_rank_in_set = groups.extra["set_rank"]
    send_splits = list(request.meta.splits or ())
    recv_splits = []
    for r in groups.ranks:
        splits = response.metas[r].splits
        assert splits is not None, "every rank's alltoall request carries its splits (ops/alltoall.py)"
        recv_splits.append(splits[my_rank_in_set])
    row_shape = tuple(tensor.shape[1:])
    row_bytes = math.prod(row_shape) * tensor.element_size()
    out = torch.empty((sum(recv_splits), *row_shape), dtype=tensor.dtype, device=tensor.device)
    if row_bytes > 0 and (sum(recv_splits) > 0 or sum(send_splits) > 0):
        send = _bytes(tensor)[: sum(send_splits) * row_bytes]
        device = request.meta.device
        _wait(
            groups.group(device).alltoall_base(
                _bytes(out),
                send,
                [s * row_bytes for s in recv_splits],
                [s * row_bytes for s in send_splits],
                dist.AllToAllOptions(),
            ),
            device,
            groups,
        )
    request.outputs[0] = out
    request.extra["received_splits"] = recv_splits


def reducescatter_rows(dim0: int, set_size: int) -> list[int]:
    """Horovod's uneven split: the first ``dim0 % n`` ranks get one extra row."""
    base, extra = divmod(dim0, set_size)
    return [base + (1 if i < extra else 0) for i in range(set_size)]


def run_reducescatter(response: Response, request: Request, groups: SetGroups) -> None:
    """Reduce everything (allreduce), then keep this rank's rows."""
    _wait_inputs([request])
    ref = response.reference
    n = len(groups.ranks)
    me = groups.extra["set_rank"]
    device = request.meta.device
    for i, tensor in enumerate(request.inputs):
        buffer = tensor.clone()
        scale_(buffer, ref.prescale)
        wire = buffer.to(_WIRE_DTYPE[buffer.dtype]) if buffer.dtype in _WIRE_DTYPE else buffer
        if wire.numel() > 0:
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]  # a RedOpType, as above
            _wait(groups.group(device).allreduce([wire], opts), device, groups)
        if wire is not buffer:
            buffer.copy_(wire)
        rows = reducescatter_rows(tensor.shape[0], n)
        start = sum(rows[:me])
        out = buffer[start : start + rows[me]].clone()
        scale_(out, ref.postscale / n if ref.reduce_op == AVERAGE else ref.postscale)
        request.outputs[i] = out


def run_single(response: Response, request: Request, groups: SetGroups) -> None:
    """Dispatch a non-fused response."""
    if response.op == OpType.ALLREDUCE:
        run_allreduce([(response, request)], groups)
        return
    device = request.meta.device
    if transport_device(device, groups) != device:
        _run_through_host(response, request, groups)
    else:
        _run_op(response, request, groups)
    _settle(device)


def _run_op(response: Response, request: Request, groups: SetGroups) -> None:
    if response.op == OpType.ALLGATHER:
        run_allgather(response, request, groups)
    elif response.op == OpType.BROADCAST:
        run_broadcast(response, request, groups)
    elif response.op == OpType.ALLTOALL:
        run_alltoall(response, request, groups)
    elif response.op == OpType.REDUCESCATTER:
        run_reducescatter(response, request, groups)
    else:
        raise AssertionError(f"not a data op: {response.op}")


def _run_through_host(response: Response, request: Request, groups: SetGroups) -> None:
    """Run a CUDA request on host copies over the CPU paths, then put the results on its GPU.

    For sets whose members share a GPU (see :func:`transport_device`). Every member stages, so the
    CPU path sees CPU requests everywhere; in-place outputs are written back in place.
    """
    _wait_inputs([request])
    device = torch.device("cuda", request.meta.device)
    metas = {rank: dataclasses.replace(meta, device=-1) for rank, meta in response.metas.items()}
    host = Request(meta=dataclasses.replace(request.meta, device=-1), handle=request.handle,
                   inputs=[t.cpu() for t in request.inputs], outputs=[None] * len(request.outputs),
                   extra=request.extra)
    _run_op(dataclasses.replace(response, metas=metas), host, groups)
    for i, result in enumerate(host.outputs):
        if result is None:
            continue
        out = request.outputs[i]
        if out is not None and out.shape == result.shape and out.dtype == result.dtype:
            out.copy_(result)
        else:
            request.outputs[i] = result.to(device)
