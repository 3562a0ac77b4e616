"""Allreduce of a sparse COO tensor, as allgathers of its indices and values."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ringtrain.engine import state
from ringtrain.ops.allgather import allgather_async
from ringtrain.ops.requests import Average, Sum, synchronize
from ringtrain.process_sets import ProcessSet, global_process_set


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None, op: int, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Allreduce a sparse COO tensor by allgathering indices and values; returns a zero-arg function."""
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async supports hvd.Average and hvd.Sum only, got op={op}.")
    sparse = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = sparse.indices().transpose(0, 1).contiguous()
    values = sparse.values().contiguous()
    base = name if name is not None else f"sparse.noname.{state.require().handles.peek_next()}"
    index_handle = allgather_async(indices, f"{base}.indices", process_set)
    value_handle = allgather_async(values, f"{base}.values", process_set)

    def handle() -> torch.Tensor:
        all_indices = synchronize(index_handle)
        all_values = synchronize(value_handle)
        if op == Average:
            all_values = all_values / len(state.require().sets[process_set.process_set_id].ranks)
        return torch.sparse_coo_tensor(all_indices.transpose(0, 1), all_values, size=tensor.size())

    return handle
