"""Broadcast from a global root rank, out of place and in place, with its autograd function."""

from __future__ import annotations

from typing import Any

import torch

from ringtrain.engine import state
from ringtrain.engine.requests import OpType
from ringtrain.op_requests import MOVE_DTYPES, Average, check_tensor, first_output, run_sync, submit
from ringtrain.ops.allreduce import allreduce
from ringtrain.ops.basics import rank
from ringtrain.process_sets import ProcessSet, global_process_set


def _broadcast_async(
    tensor: torch.Tensor,
    output: torch.Tensor | None,
    root_rank: int,
    name: str | None,
    process_set: ProcessSet,
) -> int:
    check_tensor(tensor, MOVE_DTYPES)
    engine = state.require()
    set_id = process_set.process_set_id
    ranks = engine.sets[set_id].ranks if set_id in engine.sets else []
    if set_id in engine.sets and (not isinstance(root_rank, int) or root_rank not in ranks):
        raise ValueError(f"broadcast received invalid root rank {root_rank} for provided process set")
    return submit(
        OpType.BROADCAST, "broadcast", [tensor], [output], name, process_set, first_output, root=root_rank
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
    return run_sync(broadcast_async_, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast: averaged gradient on the root, zeros elsewhere."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return run_sync(broadcast_async, tensor, root_rank, name, process_set)

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
