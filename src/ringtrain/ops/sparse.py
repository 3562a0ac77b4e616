"""Sparse gradients (``nn.Embedding(sparse=True)``): reduced as Horovod does, and kept sparse.

A sparse COO tensor is reduced by allgathering its indices and its values (ranks may hold different
numbers of rows) and coalescing the union: rows named by several ranks are summed, and the result has
one entry per row, as the gradient of the whole global batch would. ``DistributedOptimizer`` uses this
for sparse gradients unless ``sparse_as_dense=True``; with that flag the gradient travels as a dense
allreduce, and the sum is turned back into a sparse gradient of the same layout, so optimizers that
accept only sparse gradients (``SparseAdam``) still work.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ringtrain.engine import state
from ringtrain.op_requests import Average, Sum, synchronize
from ringtrain.ops.allgather import allgather_async
from ringtrain.process_sets import ProcessSet, global_process_set


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None, op: int, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Start the allgathers of ``tensor``'s indices and values; the returned function waits for both
    and gives the reduced tensor (sparse, coalesced, same size and sparse dimensions as ``tensor``)."""
    if op not in (Average, Sum):
        raise ValueError(
            f"sparse_allreduce_async supports hvd.Average and hvd.Sum only, got op={op}. "
            "HINT: reduce sparse gradients with op=hvd.Average (the default) or hvd.Sum."
        )
    if not tensor.is_sparse:
        raise ValueError(
            f"sparse_allreduce_async expects a sparse COO tensor, got a {tensor.layout} tensor. "
            "HINT: use hvd.allreduce for dense tensors."
        )
    local = tensor.coalesce()  # one entry per row: less to send
    # Allgather concatenates along dim 0: indices go as (nnz, sparse_dim) rows, values as (nnz, ...).
    indices = local.indices().transpose(0, 1).contiguous()
    values = local.values().contiguous()
    base = name if name is not None else f"sparse.noname.{state.require().handles.peek_next()}"
    index_handle = allgather_async(indices, f"{base}.indices", process_set)
    value_handle = allgather_async(values, f"{base}.values", process_set)
    members = process_set.size()

    def wait() -> torch.Tensor:
        all_indices = synchronize(index_handle)
        all_values = synchronize(value_handle)
        if op == Average:
            all_values = all_values / members
        gathered = torch.sparse_coo_tensor(
            all_indices.transpose(0, 1), all_values, size=tensor.size(), check_invariants=False
        )
        return gathered.coalesce()

    return wait


def as_dense(grad: torch.Tensor) -> torch.Tensor:
    """The gradient to allreduce densely: a dense copy of a sparse gradient, else the gradient itself."""
    return grad.to_dense() if grad.is_sparse else grad


def like_sparse(reduced: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``reduced`` (dense or sparse) in the sparse layout of ``grad``: the same sparse dimensions, so an
    embedding's gradient stays row-sparse (zero rows are dropped), coalesced."""
    if reduced.is_sparse:
        return reduced.coalesce()
    return reduced.to_sparse(grad.sparse_dim()).coalesce()


def empty_like_sparse(param: torch.Tensor) -> torch.Tensor:
    """A sparse gradient with no rows, for a parameter this rank did not use in the step.

    One sparse dimension, as ``nn.Embedding`` and ``nn.EmbeddingBag`` produce: the other ranks'
    gradients of the same parameter have that layout, and allgather needs matching row widths.
    """
    indices = torch.empty(1, 0, dtype=torch.int64, device=param.device)
    values = torch.empty(0, *param.shape[1:], dtype=param.dtype, device=param.device)
    return torch.sparse_coo_tensor(indices, values, param.shape).coalesce()


__all__ = ["as_dense", "empty_like_sparse", "like_sparse", "sparse_allreduce_async"]
