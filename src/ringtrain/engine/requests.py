"""Request and response records: what a rank asks for, and what all ranks agreed to run.

``RequestMeta`` is the small, picklable description of a request that travels in negotiation rounds;
``Request`` adds this process's tensors and handle. ``Response`` is the outcome of negotiation and is
identical on every rank (it also lives in the response cache).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

#: Reduce operations, with Horovod's integer values.
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4, 5
REDUCE_OP_NAMES = {
    AVERAGE: "AVERAGE",
    SUM: "SUM",
    ADASUM: "ADASUM",
    MIN: "MIN",
    MAX: "MAX",
    PRODUCT: "PRODUCT",
}


class OpType(enum.IntEnum):
    """Kinds of requests the engine negotiates."""

    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    PROCESS_SET_ADD = 6
    PROCESS_SET_REMOVE = 7

    @property
    def title(self) -> str:
        """``Allgather``-style name used in Horovod's join error."""
        return self.name.capitalize()


@dataclass(frozen=True)
class RequestMeta:
    """What every rank needs to know about one rank's request (sent in negotiation rounds)."""

    key: str
    names: tuple[str, ...]
    op: OpType
    set_id: int
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    reduce_op: int = SUM
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    device: int = -1
    splits: tuple[int, ...] | None = None
    payload: tuple[int, ...] | None = None


@dataclass
class Request:
    """One rank's pending request: metadata plus the local tensors and completion callback."""

    meta: RequestMeta
    handle: int
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor | None]
    slot: int | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    ready_events: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    """An agreed decision about one key: run it (with every rank's metadata) or fail it everywhere."""

    key: str
    set_id: int
    op: OpType
    metas: dict[int, RequestMeta]
    error: str | None = None

    @property
    def reference(self) -> RequestMeta:
        """The metadata of the lowest rank that submitted (identical fields on every rank)."""
        return self.metas[min(self.metas)]


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: short and stable across processes."""
    return str(dtype).replace("torch.", "")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`."""
    return getattr(torch, name)
