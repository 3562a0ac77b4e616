"""Alltoall: rows to every member of the set by ``splits``, with its autograd function."""

from __future__ import annotations

from typing import Any

import torch

from ringtrain.engine.requests import OpType, Request
from ringtrain.op_requests import MOVE_DTYPES, check_tensor, first_output, run_sync, set_members, submit
from ringtrain.process_sets import ProcessSet, global_process_set


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
    check_tensor(tensor, MOVE_DTYPES)
    _, _, ranks = set_members(process_set, "Alltoall")
    values = _alltoall_splits(tensor, splits, len(ranks))
    splits_device = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")

    def finish(request: Request) -> tuple[torch.Tensor, torch.Tensor]:
        received = torch.tensor(request.extra["received_splits"], dtype=torch.int32, device=splits_device)
        return first_output(request), received

    return submit(OpType.ALLTOALL, "alltoall", [tensor], [None], name, process_set, finish, splits=values)


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: gradients go back to their senders."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None, process_set: ProcessSet
    ) -> tuple[torch.Tensor, torch.Tensor]:
        output, received_splits = run_sync(alltoall_async, tensor, splits, name, process_set)
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, grad_received_splits: Any) -> tuple[Any, ...]:
        grad, _ = run_sync(alltoall_async, grad_output.contiguous(), ctx.recvsplits, None, ctx.process_set)
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
