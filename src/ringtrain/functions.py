"""Helpers that make every rank start from the same state: parameters, optimizer state, objects.

``broadcast_parameters`` and ``broadcast_optimizer_state`` are what a training script calls once after
building its model and optimizer; ``broadcast_object`` / ``allgather_object`` move any picklable
Python object.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import cloudpickle
import torch

from ringtrain import mpi_ops
from ringtrain.process_sets import ProcessSet, global_process_set


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite ``params`` in place with the values of ``root_rank``.

    ``params`` is a dict such as ``model.state_dict()`` (items sorted by key, keys used as op names),
    a list of tensors, or a list of ``(name, tensor)`` tuples such as
    ``list(model.named_parameters())``. A generator is refused, as in Horovod, because a one-shot
    iterator silently consumed elsewhere would broadcast nothing.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for name, tensor in items:
        if not torch.is_tensor(tensor):
            continue
        # detach(): the same storage, without autograd objecting to an in-place write on a leaf.
        handles.append(mpi_ops.broadcast_async_(tensor.detach(), root_rank, name))
    for handle in handles:
        mpi_ops.synchronize(handle)


def _initialize_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """Create the optimizer's state by one step on zero gradients (Horovod does the same).

    The step changes nothing for SGD-like optimizers, but Adam-like ones do advance their step count
    (a known Horovod side effect kept for compatibility).
    """
    sparse_params: set[int] = set()
    if model is not None:
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding | torch.nn.EmbeddingBag) and module.sparse:
                sparse_params.update(id(p) for p in module.parameters())
    force_sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad or p in optimizer.state and optimizer.state[p]:
                continue
            zeros = torch.zeros_like(p)
            p.grad = zeros.to_sparse() if force_sparse or id(p) in sparse_params else zeros
    # A DistributedOptimizer takes this fake step locally (skip_synchronize): no allreduce, which
    # every rank would have to join. A LocalSGD takes it on its wrapped optimizer alone: a step that
    # counted toward sync_every could make this rank average at another step than the others.
    inner_step = getattr(optimizer, "_ringtrain_inner_step", None)
    skip_synchronize = getattr(optimizer, "skip_synchronize", None)
    if inner_step is not None:
        inner_step()
    elif skip_synchronize is not None:
        with skip_synchronize():
            optimizer.step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None) -> None:
    """Overwrite the optimizer's state and hyper-parameters with those of ``root_rank``.

    Tensor state is broadcast in place; scalar state and param-group options (lr, betas, momentum,
    ...) travel in one pickled dict, so their Python types survive. An optimizer without state gets
    it created first by a zero-gradient step. ``model`` tells which parameters belong to sparse
    embeddings (they get sparse zero gradients for that step).

    A ``DistributedOptimizer(..., shard_optimizer_state=True)`` keeps each parameter's state on the rank
    that owns it: this re-shards it to the current owners, creates it where no rank has any, and
    broadcasts the parameter groups' options (:mod:`ringtrain.sharding`).

    A ``ringtrain.LocalSGD`` optimizer also takes ``root_rank``'s parameters as its anchor, and its step
    count and outer optimizer state (``LocalSGD.broadcast_state``).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    sharding = getattr(optimizer, "_ringtrain_sharding", None)
    if sharding is not None:
        # shard_optimizer_state=True: per-parameter state stays with its owner (ringtrain.sharding)
        sharding.broadcast(root_rank, model)
        return
    _broadcast_wrapped_state(optimizer, root_rank, model)
    local_sgd_state = getattr(optimizer, "_ringtrain_broadcast_state", None)
    if local_sgd_state is not None:
        local_sgd_state(root_rank)


def _broadcast_wrapped_state(optimizer: torch.optim.Optimizer, root_rank: int,
                             model: torch.nn.Module | None) -> None:
    """``broadcast_optimizer_state`` of the torch optimizer's own state and options."""
    if not optimizer.state:
        _initialize_state(optimizer, model)
    if not optimizer.state:
        return  # stateless (e.g. SGD without momentum): only the options could differ
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scalars: dict[str, Any] = {}
    setters: dict[str, Callable[[Any], None]] = {}
    tensors: list[tuple[str, torch.Tensor]] = []

    for index, group in enumerate(optimizer.param_groups):
        for option, value in group.items():
            if option == "params":
                continue
            key = f"{option}.{index}"
            scalars[key] = value
            setters[key] = functools.partial(group.__setitem__, option)

    occurrences: collections.Counter[str] = collections.Counter()
    for p in params:
        state = optimizer.state.get(p)
        if not state:
            continue
        for entry, value in sorted(state.items()):
            occurrences[entry] += 1
            key = f"{entry}.{occurrences[entry]}"
            if torch.is_tensor(value):
                tensors.append((key, value))
            else:
                scalars[key] = value
                setters[key] = functools.partial(state.__setitem__, entry)

    broadcast_parameters(tensors, root_rank)
    received = broadcast_object(scalars, root_rank, name="optimizer.state.scalars")
    for key, value in received.items():
        if key in setters:
            setters[key](value)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` (a global rank) to every member of the set.

    Returns the root's object on every rank (the root gets its own object back, not a copy).
    The object travels as a pickle and is unpickled on every rank, as in Horovod: that is a contract
    between the ranks of one job, which trust each other. Nobody else can feed it: every connection
    that carries it proved the job's secret first (docs/security.md).
    """
    name = name or type(obj).__name__
    if mpi_ops.rank() == root_rank:
        payload = torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int32)
        mpi_ops.broadcast_(size, root_rank, name + ".sz", process_set=process_set)
        mpi_ops.broadcast_(payload, root_rank, name + ".t", process_set=process_set)
        return obj
    size = torch.zeros(1, dtype=torch.int32)
    mpi_ops.broadcast_(size, root_rank, name + ".sz", process_set=process_set)
    payload = torch.empty(int(size[0]), dtype=torch.uint8)
    mpi_ops.broadcast_(payload, root_rank, name + ".t", process_set=process_set)
    return cloudpickle.loads(payload.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Gather a picklable object from every member of the set; a list in set order.

    Unpickles every rank's object, as :func:`broadcast_object` does (same trust: the job's ranks only).
    """
    name = name or type(obj).__name__
    payload = torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)
    sizes = mpi_ops.allgather(torch.tensor([payload.numel()], dtype=torch.int32), name=name + ".sz",
                              process_set=process_set)
    data = mpi_ops.allgather(payload, name=name + ".t", process_set=process_set).numpy().tobytes()
    objects, offset = [], 0
    for size in sizes.tolist():
        objects.append(cloudpickle.loads(data[offset:offset + size]))
        offset += size
    return objects


__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
