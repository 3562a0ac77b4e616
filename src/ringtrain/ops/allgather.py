"""Allgather (dim 0 may differ per rank), single and grouped, with their autograd functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ringtrain.engine.requests import OpType
from ringtrain.op_requests import (
    MOVE_DTYPES,
    Average,
    all_outputs,
    check_tensor,
    first_output,
    run_sync,
    submit,
)
from ringtrain.ops.allreduce import allreduce, grouped_allreduce
from ringtrain.process_sets import ProcessSet, global_process_set


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start an allgather (dim 0 may differ per rank); returns a handle."""
    check_tensor(tensor, MOVE_DTYPES)
    return submit(OpType.ALLGATHER, "allgather", [tensor], [None], name, process_set, first_output)


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather: averaged gradient, this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        return run_sync(allgather_async, tensor, name, process_set)

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
        check_tensor(t, MOVE_DTYPES)
    return submit(
        OpType.ALLGATHER,
        "allgather",
        list(tensors),
        [None] * len(tensors),
        name,
        process_set,
        all_outputs,
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
        return run_sync(grouped_allgather_async, list(tensors), name, process_set)

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
