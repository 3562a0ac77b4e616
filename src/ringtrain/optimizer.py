"""``DistributedOptimizer``: wrap any torch optimizer so gradients are averaged across ranks.

Each parameter gets a post-accumulate-grad hook. Parameters are allreduced in buckets (the user's
``groups``, or by default runs of parameters in backward order up to ``RINGTRAIN_BUCKET_CAP_MB``,
25 MB, the first bucket 1 MB): once every gradient of a bucket is final for this step (after
``backward_passes_per_step`` backward passes), the hook submits one named, asynchronous, in-place
grouped allreduce, so communication of late layers overlaps backward computation of early ones
(unless that only makes the ranks' threads take turns on fully used cores: ``ringtrain.overlap``).
``step()`` waits for the handles (``synchronize()``) and then runs the wrapped optimizer's step.
``RINGTRAIN_BUCKET_CAP_MB=0`` gives Horovod's own one-request-per-parameter behaviour.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ringtrain import mpi_ops
from ringtrain.adasum_optimizer import DistributedAdasumOptimizer
from ringtrain.compression import CastCompressor, Compression, Compressor
from ringtrain.engine import state
from ringtrain.env.cores import usable_cores
from ringtrain.functions import broadcast_object
from ringtrain.ops import sparse
from ringtrain.optimizer_names import STEP_AFTER_SYNC, TOO_MANY_PASSES, ZERO_GRAD_RACE, parameter_names
from ringtrain.overlap import should_overlap
from ringtrain.process_sets import ProcessSet, global_process_set


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods grafted onto a dynamic subclass of the user's optimizer class.

    Never instantiated directly: ``DistributedOptimizer`` builds ``type(name, (UserClass,), ...)``
    from this class's namespace, so base-class calls go through ``self._ringtrain_base``.
    """

    _ringtrain_base: type[torch.optim.Optimizer]

    def __init__(self, params: Any, named_parameters: Any, compression: type[Compressor],
                 backward_passes_per_step: int, op: int, gradient_predivide_factor: float,
                 groups: Any, sparse_as_dense: bool, process_set: ProcessSet) -> None:
        # the user's optimizer class, whose __init__ defaults every hyperparameter (torch.optim's all
        # do), not Optimizer.__init__(params, defaults)
        base_init: Callable[..., None] = self._ringtrain_base.__init__
        base_init(self, params)
        self._compression = compression
        self._parameter_names = parameter_names(self, named_parameters, backward_passes_per_step)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        if op == mpi_ops.Average:
            self._prescale = 1.0 / gradient_predivide_factor
            self._postscale = gradient_predivide_factor
        else:
            self._prescale = self._postscale = 1.0
        # Parameters are allreduced in buckets: one grouped (fused, atomic) request per bucket,
        # submitted when the bucket's last gradient is ready. A bucket is a user group
        # (``groups=``) or, by default, a run of parameters in backward order up to a size cap,
        # like DDP's buckets: far fewer requests per step than one per parameter, and later
        # buckets still overlap the rest of the backward pass.
        self._handles: dict[torch.Tensor, Any] = {}  # params touched this step -> solo handle or None
        self._allreduce_delay: dict[torch.Tensor, int] = {}
        self._requires_update: set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles: list[Any] = []
        self._groups: list[list[torch.Tensor]] | None = None  # the user's groups, as given
        self._buckets: list[list[torch.Tensor]] = []
        self._bucket_names: list[str] = []
        self._bucket_of: dict[torch.Tensor, int] = {}
        self._bucket_pending: list[int] = []
        self._bucket_handles: dict[int, tuple[Any, list[Any]]] = {}
        self._solo: set[torch.Tensor] = set()  # sparse gradients: allgather-based, one by one

        world = mpi_ops.size()  # before init this raises Horovod's "use hvd.init()" ValueError
        settings = state.require().settings
        communicate = process_set.included() and (world > 1 or settings.elastic)
        #: Whether a full bucket is sent from the backward pass (ringtrain.overlap) or in synchronize().
        self._overlap = True
        if communicate:
            self._set_buckets(groups, settings.bucket_cap_mb)
            self._register_hooks()
            trainable = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
            self._overlap = should_overlap(
                settings.overlap, world_size=world, local_size=mpi_ops.local_size(),
                threads=torch.get_num_threads(), cores=usable_cores(),
                on_gpu=any(p.device.type != "cpu" for p in trainable))

    # --- setup -------------------------------------------------------------------------------

    def _set_buckets(self, groups: Any, cap_mb: float) -> None:
        trainable = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        split: list[list[torch.Tensor]] = []
        if isinstance(groups, int):
            # Every rank must split the same ordered list: take rank 0's order of names.
            local = {self._parameter_names[p]: p for p in trainable}
            order = broadcast_object([self._parameter_names[p] for p in trainable], 0,
                                     name="DistributedOptimizer.groups", process_set=self.process_set)
            ordered = [local[name] for name in order if name in local]
            chunk = -(-len(ordered) // groups)
            split = [ordered[i:i + chunk] for i in range(0, len(ordered), chunk)]
        elif groups is not None:
            wanted = {id(p) for p in trainable}
            split = [[p for p in g if id(p) in wanted] for g in groups]
        if groups is not None:
            self._groups = [g for g in split if g]
        grouped = {id(p) for g in split for p in g}
        rest = [p for p in reversed(trainable) if id(p) not in grouped]  # roughly backward order
        self._buckets = [g for g in split if g] + self._auto_buckets(rest, cap_mb)
        for index, members in enumerate(self._buckets):
            for p in members:
                self._bucket_of[p] = index
        self._bucket_names = [f"{self._parameter_names[m[0]]}+{len(m)}" for m in self._buckets]
        self._bucket_pending = [len(m) for m in self._buckets]

    @staticmethod
    def _auto_buckets(params: list[torch.Tensor], cap_mb: float) -> list[list[torch.Tensor]]:
        """Split ``params`` into runs of at most ``cap_mb`` MiB (RINGTRAIN_BUCKET_CAP_MB, default 25; the
        first bucket 1 MiB so communication starts early); 0 means one parameter per bucket (Horovod's)."""
        if cap_mb <= 0:
            return [[p] for p in params]
        buckets: list[list[torch.Tensor]] = []
        current: list[torch.Tensor] = []
        size, cap = 0, min(cap_mb, 1.0) * 2**20
        for p in params:
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                buckets.append(current)
                current, size, cap = [], 0, cap_mb * 2**20
        if current:
            buckets.append(current)
        return buckets

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    # --- communication -----------------------------------------------------------------------

    def _grad_ready(self, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook: p.grad is final for this backward pass."""
        delay = self._allreduce_delay[p]
        if delay <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        if p.grad is None or p.grad.requires_grad:
            return
        self._allreduce_delay[p] = delay = delay - 1
        if p not in self._handles:
            self._handles[p] = None
        if delay > 0:
            return
        if p.grad.is_sparse and not self.sparse_as_dense:
            self._make_solo(p)
            self._handles[p] = self._submit_solo(p)
            return
        index = self._bucket_of[p]
        self._bucket_pending[index] -= 1
        if self._bucket_pending[index] == 0 and self._overlap:
            self._submit_bucket(index)

    def _make_solo(self, p: torch.Tensor) -> None:
        """Take a parameter with sparse gradients out of its bucket (for good: same on every rank)."""
        if p in self._solo:
            return
        self._solo.add(p)
        index = self._bucket_of.pop(p)
        self._buckets[index] = [q for q in self._buckets[index] if q is not p]
        self._bucket_pending[index] -= 1
        if self._buckets[index] and self._bucket_pending[index] == 0:
            self._submit_bucket(index)

    def _submit_solo(self, p: torch.Tensor) -> Any:
        """Sparse gradient: allgather of indices and values; returns a zero-argument callable."""
        assert p.grad is not None, "called once the gradient is there (its hook, or synchronize)"
        return mpi_ops.sparse_allreduce_async(p.grad, name=self._parameter_names.get(p), op=self.op,
                                              process_set=self.process_set)

    def _submit_bucket(self, index: int) -> None:
        members = self._buckets[index]
        if not members:
            return
        grads = []
        for p in members:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        compress = self._compression.compress
        # sparse_as_dense: a dense copy travels; the gradient itself stays sparse (see synchronize).
        packed = [compress(sparse.as_dense(grad)) for grad in grads]
        handle = mpi_ops.grouped_allreduce_async_([t for t, _ in packed], name=self._bucket_names[index],
                                                  op=self.op, prescale_factor=self._prescale,
                                                  postscale_factor=self._postscale,
                                                  process_set=self.process_set)
        self._bucket_handles[index] = (handle, [ctx for _, ctx in packed])

    def synchronize(self) -> None:
        """Wait for every gradient allreduce of this step and write the results into ``p.grad``.

        Parameters whose gradient never arrived on this rank (unused in its forward pass) are
        allreduced now, with zeros if they have no gradient, so the other ranks are not left waiting.
        """
        if not self.process_set.included() or not self._requires_update:
            self._synchronized = True
            return
        for index in range(len(self._buckets)):
            if index not in self._bucket_handles:
                self._submit_bucket(index)
        for p in self._solo:
            if self._handles.get(p) is None:
                if p.grad is None:
                    p.grad = sparse.empty_like_sparse(p)
                self._handles[p] = self._submit_solo(p)
        decompress = self._compression.decompress
        # The built-in cast compressors' decompress is a dtype cast, which copy_ does on the way into
        # the gradient anyway: skipping it saves a pass over the bucket.
        casts = isinstance(self._compression, type) and issubclass(self._compression, CastCompressor)
        for index, (handle, contexts) in self._bucket_handles.items():
            outputs = mpi_ops.synchronize(handle)
            for p, output, ctx in zip(self._buckets[index], outputs, contexts):
                grad = p.grad
                assert grad is not None, "_submit_bucket gave every member a gradient"
                if grad.is_sparse:  # sparse_as_dense: back to a sparse gradient, as Horovod does
                    p.grad = sparse.like_sparse(decompress(output, ctx), grad)
                    continue
                if casts and ctx == grad.dtype:
                    grad.copy_(output)
                    continue
                result = decompress(output, ctx)
                if result.data_ptr() != grad.data_ptr():
                    grad.copy_(result)
        for p in self._solo:
            result = self._handles[p]()
            grad = p.grad
            assert grad is not None, "every solo parameter got a gradient above"
            if grad.is_sparse:
                p.grad = result
            else:
                grad.copy_(result.to_dense())
        self._reset_step()
        self._synchronized = True

    def _reset_step(self) -> None:
        self._handles.clear()
        self._bucket_handles.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._bucket_pending = [len(m) for m in self._buckets]

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Let ``step()`` skip its ``synchronize()``: use after calling ``synchronize()`` yourself
        (e.g. to unscale or clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Average the gradients (unless inside ``skip_synchronize()``), then step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(STEP_AFTER_SYNC, UserWarning, stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return self._ringtrain_base.step(self, closure)

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Zero the gradients; refused while allreduces of this step are still pending."""
        if self._handles:
            raise AssertionError(ZERO_GRAD_RACE)
        return self._ringtrain_base.zero_grad(self, *args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load optimizer state and forget any half-finished step."""
        self._reset_step()
        self._synchronized = False
        self._should_synchronize = True
        return self._ringtrain_base.load_state_dict(self, *args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated locally before each allreduce."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


_GRAFTED = {name: value for name, value in vars(_DistributedOptimizer).items()
            if name not in ("__dict__", "__weakref__", "__annotations__", "__doc__", "__module__")}


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
                         op: int = mpi_ops.Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged (``op``) over the process set.

    Returns an instance of a new subclass of ``type(optimizer)`` (``isinstance`` still holds; LR
    schedulers and GradScaler work) built from ``optimizer.param_groups``; the wrapped optimizer's
    existing ``state`` is not carried over. ``named_parameters`` (usually
    ``model.named_parameters()``) names each allreduce; ``compression`` casts gradients on the wire;
    ``backward_passes_per_step`` accumulates that many backward passes locally before communicating;
    ``gradient_predivide_factor`` splits the averaging into a division before and after the sum;
    ``groups`` (an int, or lists of parameters) allreduces parameters in atomic groups.
    """
    if gradient_predivide_factor != 1.0 and op != mpi_ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if not (isinstance(groups, list) or isinstance(groups, int) and groups > 0):
            raise ValueError("groups should be a non-negative integer or a list of lists of torch.Tensor.")
        if isinstance(groups, list):
            seen: set[int] = set()
            for group in groups:
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor.")
                    if id(p) in seen:
                        raise ValueError("A parameter can only appear once in groups.")
                    seen.add(id(p))
    if op == mpi_ops.Adasum and mpi_ops.size() > 1:
        # Horovod's delta optimizer: each rank steps locally and the parameter deltas are combined.
        return DistributedAdasumOptimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                                          process_set)
    base = type(optimizer)
    namespace = dict(_GRAFTED)
    namespace["_ringtrain_base"] = base
    namespace["__module__"] = base.__module__
    namespace["__doc__"] = base.__doc__
    cls = type(base.__name__, (base,), namespace)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)


__all__ = ["DistributedOptimizer"]
