"""Reducescatter, single and grouped: each member gets its dim-0 slice of the reduction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ringtrain.compression import Compression
from ringtrain.engine.requests import OpType
from ringtrain.exceptions import HorovodInternalError
from ringtrain.op_requests import (
    REDUCE_DTYPES,
    Average,
    Sum,
    all_outputs,
    check_tensor,
    first_output,
    run_sync,
    submit,
)
from ringtrain.ops.allgather import allgather, grouped_allgather
from ringtrain.process_sets import ProcessSet, global_process_set


def _check_reducescatter(tensor: torch.Tensor, op: int) -> None:
    check_tensor(tensor, REDUCE_DTYPES - {torch.bool})
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
    return submit(
        OpType.REDUCESCATTER,
        "reducescatter",
        [tensor],
        [None],
        name,
        process_set,
        first_output,
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
        return run_sync(reducescatter_async, tensor, name, op, process_set, prescale_factor, postscale_factor)

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
    compression: Any = Compression.none,
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
    return submit(
        OpType.REDUCESCATTER,
        "reducescatter",
        list(tensors),
        [None] * len(tensors),
        name,
        process_set,
        all_outputs,
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
        return run_sync(
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
    compression: Any = Compression.none,
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
