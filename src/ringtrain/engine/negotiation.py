"""Negotiation: the per-round wire format and the deterministic agreement checks.

Each round every rank contributes one float64 vector to a single SUM-allreduce on the control group::

    [payload_len_0, flags_0, payload_len_1, flags_1, ..., bit_slot_0, bit_slot_1, ..., eager data]

Rank ``r`` writes only its own two header entries, so the sum carries every rank's values; the slot
part counts, per response-cache slot, how many ranks have that cached name pending. The eager part
carries the data of small cached Sum/Average allreduces at offsets fixed by the (replicated) cache:
when such a slot turns out ready, the sum already is the result, and the request completes with one
collective instead of two. Only when some
rank has new (uncached) requests does the round add one allgather of their metadata. Every rank then
runs the same decision code on the same replicated data, so no coordinator broadcast is needed.

That metadata travels as JSON of plain lists, numbers and strings in a fixed layout
(:func:`encode_payload`), never as a pickle: decoding a message can build a :class:`RequestMeta`
and nothing else, and a message that does not fit the layout is refused whole (:func:`decode_payload`).

Both exchanges travel over the control plane's socket mesh when there is one (:func:`exchange`,
:func:`gather`), else over the gloo control group.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ringtrain.engine import liveness
from ringtrain.engine.executor import mesh_allreduce, reduce_in_rank_order
from ringtrain.engine.requests import REDUCE_OP_NAMES, SUM, OpType, RequestMeta, dtype_name

FLAG_JOINED = 1
FLAG_SHUTDOWN = 2
FLAG_PENDING = 4

HEADER_WIDTH = 2
#: Rounds whose gathered vectors (all ranks together) fit in this many bytes use an allgather.
_GATHER_ROUND_BYTES = 256 * 1024


def build_vector(
    world_size: int,
    rank: int,
    num_slots: int,
    payload_len: int,
    flags: int,
    slots: list[int],
    eager_size: int = 0,
) -> torch.Tensor:
    """This rank's contribution to the round allreduce (float64: counts are exact, eager data fits)."""
    # Built as a Python list and converted once: cheaper than indexing a tensor for these few entries.
    values = [0.0] * (HEADER_WIDTH * world_size + num_slots + eager_size)
    values[HEADER_WIDTH * rank] = payload_len
    values[HEADER_WIDTH * rank + 1] = flags
    base = HEADER_WIDTH * world_size
    for slot in slots:
        values[base + slot] = 1.0
    return torch.tensor(values, dtype=torch.float64)


#: First byte of every metadata message: the layout's version (a pickle would start with 0x80).
PAYLOAD_FORMAT = b"\x01"
#: Names of the dtypes a request may carry (anything else in a message is refused).
DTYPE_NAMES = frozenset(
    dtype_name(dtype) for dtype in vars(torch).values() if isinstance(dtype, torch.dtype)
)


class PayloadError(ValueError):
    """A metadata message that does not fit the layout (another ringtrain version, or a bug)."""


def encode_payload(payload: dict[str, Any]) -> bytes:
    """``{"m": [RequestMeta...], "s": [(name, set_id)...]}`` as one JSON message (see the module doc)."""
    metas = [
        [meta.key, list(meta.names), int(meta.op), meta.set_id, list(meta.dtypes),
         [list(shape) for shape in meta.shapes], int(meta.reduce_op), meta.root, meta.prescale,
         meta.postscale, meta.device, None if meta.splits is None else list(meta.splits),
         None if meta.payload is None else list(meta.payload)]
        for meta in payload["m"]
    ]
    stalls = [[name, set_id] for name, set_id in payload["s"]]
    return PAYLOAD_FORMAT + json.dumps([metas, stalls], separators=(",", ":")).encode()


def decode_payload(data: bytes) -> dict[str, Any]:
    """The inverse of :func:`encode_payload`; :class:`PayloadError` for anything that does not fit."""
    if data[:1] != PAYLOAD_FORMAT:
        raise PayloadError(f"a negotiation message starts with {bytes(data[:1])!r}, not the expected format "
                           f"{PAYLOAD_FORMAT!r}. HINT: run the same ringtrain version on every rank.")
    try:
        metas, stalls = json.loads(bytes(data[1:]).decode())
        return {"m": [_meta(fields) for fields in _list(metas)],
                "s": [(_str(name), _int(set_id)) for name, set_id in _list(stalls)]}
    except (ValueError, TypeError) as exc:  # json errors are ValueErrors; unpacking raises TypeError
        raise PayloadError(f"a negotiation message does not fit the layout: {exc}. HINT: run the same "
                           "ringtrain version on every rank.") from None


def _meta(fields: Any) -> RequestMeta:
    (key, names, op, set_id, dtypes, shapes, reduce_op, root, prescale, postscale, device, splits,
     payload) = _list(fields)
    for name in _list(dtypes):
        if _str(name) not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {name!r}")
    return RequestMeta(
        key=_str(key),
        names=tuple(_str(n) for n in _list(names)),
        op=OpType(_int(op)),
        set_id=_int(set_id),
        dtypes=tuple(dtypes),
        shapes=tuple(tuple(_int(d) for d in _list(shape)) for shape in _list(shapes)),
        reduce_op=_int(reduce_op),
        root=_int(root),
        prescale=_float(prescale),
        postscale=_float(postscale),
        device=_int(device),
        splits=None if splits is None else tuple(_int(v) for v in _list(splits)),
        payload=None if payload is None else tuple(_int(v) for v in _list(payload)),
    )


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:  # (bool is an int subclass: refused too)
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    return value


def _float(value: Any) -> float:
    if type(value) not in (int, float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return float(value)


def exchange(vector: torch.Tensor, plane: Any, ctrl: Any, size: int) -> torch.Tensor:
    """Sum every rank's round vector; the result is bit-identical on all ranks.

    A small vector is allgathered and summed here in rank order: over the socket mesh (``plane``)
    when there is one, else with one gloo ring pass on ``ctrl`` instead of the allreduce's two
    (reduce-scatter, then allgather). Its length is a function of replicated state, so all ranks
    pick the same path.
    """
    if size == 1:
        return vector
    nbytes = vector.numel() * vector.element_size()
    if plane is not None and nbytes <= plane.max_message:
        mesh_allreduce(plane, vector, SUM)
        return vector
    if size * nbytes > _GATHER_ROUND_BYTES:
        liveness.wait_on_group(ctrl.allreduce([vector]), ctrl)
        return vector
    rows = torch.empty(size, vector.numel(), dtype=vector.dtype)
    liveness.wait_on_group(ctrl._allgather_base(rows.view(-1), vector), ctrl)
    return reduce_in_rank_order(rows.unbind(), SUM)


def gather(payload: bytes, lengths: list[int], plane: Any, ctrl: Any, size: int) -> list[bytes]:
    """Every rank's payload, in rank order (``lengths`` from the round's header)."""
    width = max(lengths)
    if plane is not None and width <= plane.max_message:
        return [bytes(data) for data in plane.allgather(payload)]
    send = torch.zeros(width, dtype=torch.uint8)
    if payload:
        send[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    recv = [torch.empty(width, dtype=torch.uint8) for _ in range(size)]
    liveness.wait_on_group(ctrl.allgather([recv], [send]), ctrl)
    return [bytes(recv[r][: lengths[r]].numpy()) if lengths[r] else b"" for r in range(size)]


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_agreement(metas: dict[int, RequestMeta]) -> str | None:
    """Horovod's coordinator checks: the error message, or None when all ranks agree."""
    ranks = sorted(metas)
    first = metas[ranks[0]]
    op = first.op
    opname = op.name
    for rank in ranks:
        meta = metas[rank]
        if meta.op != op:
            return f"Mismatched operations: One rank did an {opname}, but another rank did an {meta.op.name}."
        if len(meta.names) != len(first.names):
            return (
                f"Mismatched group sizes: One rank submitted {len(first.names)} tensors, but another "
                f"rank submitted {len(meta.names)} tensors for {first.key}."
            )
    if op in (OpType.BARRIER, OpType.PROCESS_SET_ADD, OpType.PROCESS_SET_REMOVE):
        for rank in ranks:
            if metas[rank].payload != first.payload:
                return (
                    f"Mismatched {opname} arguments: One rank passed {first.payload}, but another rank "
                    f"passed {metas[rank].payload}."
                )
        return None
    for rank in ranks:
        meta = metas[rank]
        for mine, theirs in zip(first.dtypes, meta.dtypes):
            if mine != theirs:
                return f"Mismatched data types: One rank had type {mine}, but another rank had type {theirs}."
    for rank in ranks:
        meta = metas[rank]
        if (meta.device >= 0) != (first.device >= 0):
            return (
                f"Mismatched {opname} CPU/GPU device selection: One rank specified device "
                f"{'CPU' if first.device < 0 else 'GPU'}, but another rank specified device "
                f"{'CPU' if meta.device < 0 else 'GPU'}."
            )
    if op in (OpType.ALLREDUCE, OpType.REDUCESCATTER):
        for rank in ranks:
            meta = metas[rank]
            if meta.reduce_op != first.reduce_op:
                return (
                    f"Mismatched reduction operation: One rank had op "
                    f"{REDUCE_OP_NAMES.get(first.reduce_op, first.reduce_op)}, but another rank had op "
                    f"{REDUCE_OP_NAMES.get(meta.reduce_op, meta.reduce_op)}."
                )
            if (meta.prescale, meta.postscale) != (first.prescale, first.postscale):
                return (
                    f"Mismatched prescale and/or postscale factors: One rank sent factors "
                    f"({first.prescale}, {first.postscale}), but another rank sent factors "
                    f"({meta.prescale}, {meta.postscale})."
                )
    if op in (OpType.ALLREDUCE, OpType.BROADCAST, OpType.REDUCESCATTER):
        for rank in ranks:
            for a, b in zip(first.shapes, metas[rank].shapes):
                if a != b:
                    return (
                        f"Mismatched {opname} tensor shapes: One rank sent a tensor of shape {_shape(a)}, "
                        f"but another rank sent a tensor of shape {_shape(b)}."
                    )
    if op == OpType.BROADCAST:
        for rank in ranks:
            if metas[rank].root != first.root:
                return (
                    f"Mismatched BROADCAST root ranks: One rank specified root rank {first.root}, but "
                    f"another rank specified root rank {metas[rank].root}."
                )
    if op in (OpType.ALLGATHER, OpType.ALLTOALL, OpType.REDUCESCATTER):
        for rank in ranks:
            for shape in metas[rank].shapes:
                if len(shape) == 0:
                    return f"Process-set rank zero tried to {opname} a rank-zero tensor."
    if op in (OpType.ALLGATHER, OpType.ALLTOALL):
        for rank in ranks:
            for a, b in zip(first.shapes, metas[rank].shapes):
                if len(a) != len(b):
                    return (
                        f"Mismatched {opname} tensor shapes: One rank sent a tensor of rank {len(a)}, but "
                        f"another rank sent a tensor of rank {len(b)}."
                    )
                for dim in range(1, len(a)):
                    if a[dim] != b[dim]:
                        return (
                            f"Mismatched {opname} tensor shapes: One rank sent a tensor with dimension "
                            f"{dim} equal to {a[dim]}, but another rank sent a tensor with dimension {dim} "
                            f"equal to {b[dim]}."
                        )
    if op == OpType.ALLTOALL:
        for rank in ranks:
            splits = metas[rank].splits
            if splits is None or len(splits) != len(ranks):
                return "Number of entries in splits does not equal number of workers."
    return None


def join_error(op: OpType) -> str:
    """Horovod's message for a non-allreduce op while some rank has joined."""
    return (
        f"{op.title} is not supported with Join at this time. "
        "HINT: only allreduce may run while a rank is inside hvd.join()."
    )
