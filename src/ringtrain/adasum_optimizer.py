"""``DistributedOptimizer(op=hvd.Adasum)``: Horovod's delta optimizer.

Adasum needs the whole magnitude of each rank's update, so the ranks do not combine gradients. Once a
parameter's gradient is final (after ``backward_passes_per_step`` backward passes), this rank runs the
wrapped optimizer on that parameter alone and turns the parameter into the update it made (``delta =
new - old``); the deltas are combined with an Adasum allreduce while backward goes on. ``step()`` waits
for them and sets every parameter to ``old + adasum(deltas)``, the same on every rank.

As in Horovod: ``synchronize()`` does nothing, ``skip_synchronize()`` is refused, ``compression``
applies to the deltas, ``groups`` and ``sparse_as_dense`` are not used, and a job of one rank gets the
ordinary optimizer. Learning rates: Horovod's guidance is not to scale the single-worker rate by the
number of ranks (its examples keep it for CPU tensors, and scale by ``hvd.local_size()`` for CUDA
tensors, where each host first averages its ranks' deltas; ringtrain reduces CUDA tensors the same
way). Adasum works on floating-point tensors (float16 deltas are combined in float64).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ringtrain import mpi_ops
from ringtrain.compression import Compressor
from ringtrain.optimizer_names import TOO_MANY_PASSES, ZERO_GRAD_RACE, parameter_names, unhooked_step
from ringtrain.process_sets import ProcessSet

_NO_SKIP = "Skipping synchronization is not supported when using Adasum optimizer."


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """The methods grafted onto a dynamic subclass of the user's optimizer class (see optimizer.py)."""

    _ringtrain_base: type[torch.optim.Optimizer]

    def __init__(self, params: Any, named_parameters: Any, compression: type[Compressor],
                 backward_passes_per_step: int, process_set: ProcessSet) -> None:
        # the user's optimizer class, whose __init__ defaults every hyperparameter (see optimizer.py)
        base_init: Callable[..., None] = self._ringtrain_base.__init__
        base_init(self, params)
        self._compression = compression
        self._parameter_names = parameter_names(self, named_parameters, backward_passes_per_step)
        self.backward_passes_per_step = backward_passes_per_step
        self.process_set = process_set
        self._handles: dict[torch.Tensor, tuple[int, Any] | None] = {}
        self._allreduce_delay: dict[torch.Tensor, int] = {}
        self._requires_update: list[torch.Tensor] = []
        self._starting_models: dict[torch.Tensor, torch.Tensor] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.append(p)
                self._allreduce_delay[p] = backward_passes_per_step
                self._starting_models[p] = torch.zeros_like(p, requires_grad=False)
                p.register_post_accumulate_grad_hook(self._delta_ready)

    def _delta_ready(self, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook: after the last accumulated pass, step p locally and send its delta."""
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        self._allreduce_delay[p] -= 1
        self._handles[p] = self._submit_delta(p) if self._allreduce_delay[p] == 0 else None

    def _submit_delta(self, p: torch.Tensor) -> tuple[int, Any]:
        start = self._starting_models[p]
        # Step on p alone: every other parameter is hidden from the wrapped optimizer meanwhile.
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(q is p for q in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            unhooked_step(self._ringtrain_base)(self)  # one parameter's share: not a step of the user's
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)  # p now holds this rank's update of p
        compressed, ctx = self._compression.compress(p.detach())
        handle = mpi_ops.allreduce_async_(compressed, name=self._parameter_names.get(p), op=mpi_ops.Adasum,
                                          process_set=self.process_set)
        return handle, ctx

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Combine this step's deltas (stepping parameters whose hook did not run) and apply them."""
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if self._handles.get(p) is None:
                self._handles[p] = self._submit_delta(p)
        for p, pending in self._handles.items():
            assert pending is not None
            handle, ctx = pending
            delta = self._compression.decompress(mpi_ops.synchronize(handle), ctx)
            start = self._starting_models[p]
            with torch.no_grad():
                start.add_(delta)
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def synchronize(self) -> None:
        """Nothing to do: deltas are combined in ``step()`` (as in Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        raise AssertionError(_NO_SKIP)
        yield  # pragma: no cover - a generator for contextmanager

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Zero the gradients; refused while deltas of this step are still pending."""
        if self._handles:
            raise AssertionError(ZERO_GRAD_RACE)
        return self._ringtrain_base.zero_grad(self, *args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated locally before each step."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


_GRAFTED = {name: value for name, value in vars(_DistributedAdasumOptimizer).items()
            if name not in ("__dict__", "__weakref__", "__annotations__", "__doc__", "__module__")}


def DistributedAdasumOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any,
                               compression: type[Compressor], backward_passes_per_step: int,
                               process_set: ProcessSet) -> torch.optim.Optimizer:
    """A subclass of ``type(optimizer)`` (``isinstance`` holds) that combines updates with Adasum."""
    base = type(optimizer)
    namespace = dict(_GRAFTED)
    namespace["_ringtrain_base"] = base
    namespace["__module__"] = base.__module__
    namespace["__doc__"] = base.__doc__
    cls = type(base.__name__, (base,), namespace)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, process_set)


__all__ = ["DistributedAdasumOptimizer"]
