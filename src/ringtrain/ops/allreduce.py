"""Allreduce: out of place and in place, single and grouped, with their autograd functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ringtrain.compression import Compression
from ringtrain.engine.adasum import DTYPES as ADASUM_DTYPES
from ringtrain.engine.requests import OpType
from ringtrain.op_requests import (
    REDUCE_DTYPES,
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    all_outputs,
    check_tensor,
    first_output,
    handle_average_backwards_compatibility,
    run_sync,
    submit,
)
from ringtrain.process_sets import ProcessSet, global_process_set


def _check_reduce(tensor: torch.Tensor, op: int) -> None:
    check_tensor(tensor, REDUCE_DTYPES)
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
    return submit(
        OpType.ALLREDUCE,
        "allreduce",
        [tensor],
        [output],
        name,
        process_set,
        first_output,
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
        return run_sync(
            allreduce_async, tensor, None, name, ctx.op, prescale_factor, postscale_factor, process_set
        )

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad = allreduce(
            grad_output.contiguous(),
            None,
            None,
            Compression.none,
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
    compression: Any = Compression.none,
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
    return run_sync(
        allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )


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
    return submit(
        OpType.ALLREDUCE,
        "allreduce",
        list(tensors),
        outputs,
        name,
        process_set,
        all_outputs,
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
    return run_sync(
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
        return run_sync(
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
            Compression.none,
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
    compression: Any = Compression.none,
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
