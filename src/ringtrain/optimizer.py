"""``DistributedOptimizer``: wrap any torch optimizer so gradients are averaged across ranks.

Each parameter gets a post-accumulate-grad hook. Parameters are allreduced in buckets (the user's
``groups``, or by default runs of parameters in backward order up to ``RINGTRAIN_BUCKET_CAP_MB``,
25 MB, the first bucket 1 MB): once every gradient of a bucket is final for this step (after
``backward_passes_per_step`` backward passes), the hook submits one named, asynchronous, in-place
grouped allreduce, so communication of late layers overlaps backward computation of early ones
(unless that only makes the ranks' threads take turns on fully used cores: ``ringtrain.overlap``).
``step()`` waits for the handles (``synchronize()``) and then runs the wrapped optimizer's step.
``RINGTRAIN_BUCKET_CAP_MB=0`` gives Horovod's own one-request-per-parameter behaviour.

With ``compression=hvd.Compression.powersgd(...)`` each bucket takes two allreduces instead
(``_PowerSGDExchange`` below; the math is :mod:`ringtrain.powersgd`).

With ``shard_optimizer_state=True`` each rank keeps the optimizer state of the parameters it owns only,
steps those, and the parameters are exchanged after the step (:mod:`ringtrain.sharding`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from ringtrain import mpi_ops, sharding
from ringtrain.adasum_optimizer import DistributedAdasumOptimizer
from ringtrain.compression import CastCompressor, Compression, Compressor
from ringtrain.engine import state
from ringtrain.env.cores import usable_cores
from ringtrain.functions import broadcast_object
from ringtrain.ops import sparse
from ringtrain.optimizer_names import (
    STEP_AFTER_SYNC,
    TOO_MANY_PASSES,
    ZERO_GRAD_RACE,
    parameter_names,
    unhooked_step,
)
from ringtrain.overlap import should_overlap
from ringtrain.powersgd import STATE_KEY, PowerSGDBucket, PowerSGDConfig, PowerSGDState, check_model, summary
from ringtrain.process_sets import ProcessSet, global_process_set

log = logging.getLogger("ringtrain.powersgd")

_OP_NAMES = {mpi_ops.Average: "hvd.Average", mpi_ops.Sum: "hvd.Sum", mpi_ops.Adasum: "hvd.Adasum",
             mpi_ops.Min: "hvd.Min", mpi_ops.Max: "hvd.Max", mpi_ops.Product: "hvd.Product"}
_SPARSE_POWERSGD = ("{name}: a sparse gradient (nn.Embedding(sparse=True) or the like) cannot be compressed "
                    "with {config}: PowerSGD works on dense matrices. HINT: pass sparse_as_dense=True to "
                    "DistributedOptimizer (the gradient is made dense and compressed), or use "
                    "compression=hvd.Compression.none.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods grafted onto a dynamic subclass of the user's optimizer class.

    Never instantiated directly: ``DistributedOptimizer`` builds ``type(name, (UserClass,), ...)``
    from this class's namespace, so base-class calls go through ``self._ringtrain_base``.
    """

    _ringtrain_base: type[torch.optim.Optimizer]

    def __init__(self, params: Any, named_parameters: Any, compression: type[Compressor] | PowerSGDConfig,
                 backward_passes_per_step: int, op: int, gradient_predivide_factor: float,
                 groups: Any, sparse_as_dense: bool, process_set: ProcessSet,
                 shard_optimizer_state: bool = False) -> None:
        # the user's optimizer class, whose __init__ defaults every hyperparameter (torch.optim's all
        # do), not Optimizer.__init__(params, defaults)
        base_init: Callable[..., None] = self._ringtrain_base.__init__
        base_init(self, params)
        powersgd = compression if isinstance(compression, PowerSGDConfig) else None
        # PowerSGD's steps before start_iter take the plain path, uncompressed
        self._compression: type[Compressor] = (Compression.none if isinstance(compression, PowerSGDConfig)
                                               else compression)
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
        #: PowerSGD's side, if compression=hvd.Compression.powersgd(...): its state lives here (not in
        #: ``self.state``, which broadcast_optimizer_state sends from rank 0: the error feedback is per rank).
        self._powersgd = (_PowerSGDExchange(self, powersgd, settings.elastic, bool(communicate))
                          if powersgd is not None else None)
        #: With shard_optimizer_state=True: who owns which parameter, the step of the owned ones and the
        #: exchange of parameters after it (ringtrain.sharding); broadcast_optimizer_state looks for it.
        self._ringtrain_sharding = (sharding.Sharding(self, bool(communicate), settings.elastic)
                                    if shard_optimizer_state else None)
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
        if self._powersgd is not None:
            hook = self._powersgd_grad_ready
        elif self._ringtrain_sharding is not None:
            hook = self._sharded_grad_ready
        else:
            hook = self._grad_ready
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                self._hook_handles.append(p.register_post_accumulate_grad_hook(hook))

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

    def _powersgd_grad_ready(self, p: torch.Tensor) -> None:
        """The hook with PowerSGD: a sparse gradient is refused (on every rank: same model, same
        gradient), then as ``_grad_ready``, then phase 2 of buckets whose phase 1 is done is sent."""
        powersgd = self._powersgd
        assert powersgd is not None, "registered only with PowerSGD"
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            name = self._parameter_names.get(p)
            raise ValueError(_SPARSE_POWERSGD.format(name=name, config=powersgd.config))
        self._grad_ready(p)
        powersgd.poll()

    def _sharded_grad_ready(self, p: torch.Tensor) -> None:
        """The hook with sharded optimizer state: a sparse gradient is refused (on every rank), then as
        ``_grad_ready``."""
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            raise sharding.sparse_gradient_error(self._parameter_names.get(p))
        self._grad_ready(p)

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
        if self._powersgd is not None and self._powersgd.compressing():
            self._powersgd.submit(index)
            return
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
        powersgd = self._powersgd
        if powersgd is not None and powersgd.compressing():
            powersgd.synchronize()
            self._reset_step()
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
        if powersgd is not None:
            powersgd.end_step()
        self._reset_step()
        self._synchronized = True

    def _reset_step(self) -> None:
        self._handles.clear()
        self._bucket_handles.clear()
        if self._powersgd is not None:
            self._powersgd.reset_step()
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
        if self._ringtrain_sharding is not None:
            return self._ringtrain_sharding.step(closure)
        step = unhooked_step(self._ringtrain_base)  # the hooks run once, around this step()
        return step(self) if closure is None else step(self, closure)

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Zero the gradients; refused while allreduces of this step are still pending."""
        if self._handles:
            raise AssertionError(ZERO_GRAD_RACE)
        return self._ringtrain_base.zero_grad(self, *args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict; with PowerSGD, plus ``"ringtrain_powersgd"``: this rank's
        ``{"rank", "size", "step", "config", "q", "errors"}`` (``ringtrain.powersgd.PowerSGDState``).

        The PowerSGD entry differs from rank to rank (the error feedback): save every rank's to resume
        exactly, or merge them with ``ringtrain.powersgd.merge_powersgd_states`` to resume at another
        world size.

        With ``shard_optimizer_state=True``: this rank's shard, its state by parameter name under
        ``"ringtrain_sharded"`` (:mod:`ringtrain.sharding`); save every rank's.
        """
        saved: dict[str, Any] = (self._ringtrain_base.state_dict(self) if self._ringtrain_sharding is None
                                 else self._ringtrain_sharding.state_dict())
        if self._powersgd is not None:
            saved[STATE_KEY] = self._powersgd.state_dict()
        return saved

    def load_state_dict(self, state_dict: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Load optimizer state and forget any half-finished step.

        With PowerSGD: the ``"ringtrain_powersgd"`` entry, if there is one, gives the step count and
        ``Q``, and the error feedback if this rank of a world of this size saved it (else zero); without
        the entry the error feedback is zeroed. Elastic training restores each rank's own saved state
        dict this way after a reset (``hvd.elastic.TorchState``); should the re-formed world differ in
        size, or this process get another rank, the error feedback is dropped at the next step, and in
        an elastic job the step count and ``Q`` are taken from the set's first rank then, so a rank that
        joined with a fresh optimizer agrees with the others on whether and how to compress.

        With ``shard_optimizer_state=True`` it takes this rank's own shard, the list of every rank's
        shards of a run of any size, or an unsharded state dict; each rank keeps the state of the
        parameters it owns (:mod:`ringtrain.sharding`). Unsharded, it also takes the list of every rank's
        shards of a sharded run (consolidated: ``ringtrain.sharding.consolidate``).
        """
        self._reset_step()
        self._synchronized = False
        self._should_synchronize = True
        if self._ringtrain_sharding is not None:
            saved_powersgd = self._ringtrain_sharding.load_state_dict(state_dict)
            if self._powersgd is not None:
                self._powersgd.load_state_dict(saved_powersgd)
            return None
        if isinstance(state_dict, list | tuple) or sharding.is_shard(state_dict):
            state_dict = sharding.unsharded(state_dict)
        if STATE_KEY in state_dict:
            state_dict = dict(state_dict)
            saved = state_dict.pop(STATE_KEY)
        else:
            saved = None
        if self._powersgd is not None:
            self._powersgd.load_state_dict(saved)
        return self._ringtrain_base.load_state_dict(self, state_dict)

    def sharding_report(self) -> sharding.ShardingReport:
        """This rank's part of the optimizer state: the parameters it owns, its state bytes and every
        rank's (``ringtrain.sharding.ShardingReport``; ``str()`` of it is one line to print).

        With ``shard_optimizer_state=True`` it is collective (every rank of the set calls it: the state
        bytes are gathered); unsharded, each rank owns everything and nothing is exchanged.
        """
        if self._ringtrain_sharding is None:
            if not self.process_set.included():
                return sharding.unsharded_report(self)
            return sharding.unsharded_report(self, self.process_set.rank() or 0, self.process_set.size() or 1)
        return self._ringtrain_sharding.report()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated locally before each allreduce."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


class _PowerSGDExchange:
    """PowerSGD's allreduces for one DistributedOptimizer (the math: ``ringtrain.powersgd.PowerSGDBucket``).

    Once a bucket is complete (from the gradient hook, as the plain path; or in ``synchronize()``),
    phase 1 leaves: one grouped allreduce of the bucket's flat buffer of uncompressed gradients and
    ``P_i``. Phase 2 (the ``Q_i``) leaves as soon as phase 1 is done: later hooks poll, without
    blocking, the buckets in the order they were sent; ``synchronize()`` waits for the rest in that
    order, sending each bucket's phase 2 before waiting on the next one's phase 1, then writes the
    gradients. Requests are named per bucket and phase, so ranks whose polls see completions at
    different times still match. The first ``start_iter`` steps take the optimizer's plain path.
    """

    def __init__(self, optimizer: _DistributedOptimizer, config: PowerSGDConfig, elastic: bool,
                 communicate: bool) -> None:
        self.config = config
        self._opt = optimizer
        names = optimizer._parameter_names
        trainable = {names[p]: p for group in optimizer.param_groups for p in group["params"]
                     if p.requires_grad}
        # before any collective of the optimizer (groups=int broadcasts): the same error on every rank
        check_model(config, {name: (p.shape, p.dtype) for name, p in trainable.items()})
        self.state = PowerSGDState(config, trainable)
        self._elastic = elastic
        self._engine: weakref.ref[Any] | None = None
        if communicate and not elastic:
            self._enter_world()
        if communicate and optimizer.process_set.rank() == 0:
            log.info("%s", summary(config, trainable))
        self._buckets: dict[int, PowerSGDBucket] = {}
        self._compressing: bool | None = None  # decided at the first bucket of a step
        self._sent: list[int] = []  # buckets in the order their phase 1 left
        self._phase1: dict[int, int] = {}
        self._phase2: dict[int, int | None] = {}
        self._second = 0  # how many of _sent have had phase 2 sent

    def _enter_world(self) -> None:
        """At the first step in an engine (after construction, or an elastic reset): error feedback of
        another world is dropped; in an elastic job every rank takes the step count and Q of the set's
        first rank (one that joined has a fresh optimizer, and all must agree on what to send)."""
        engine = state.engine
        if self._engine is not None and self._engine() is engine:
            return
        process_set = self._opt.process_set
        rank, size = process_set.rank(), process_set.size()
        assert rank is not None, "a member of a registered set"
        assert size is not None, "a member of a registered set"
        self.state.enter_world(rank, size)
        if self._elastic:
            ours = {"step": self.state.step, "q": {name: q.cpu() for name, q in self.state.q.items()}}
            root = process_set.ranks[0] if process_set.ranks else 0
            theirs = broadcast_object(ours, root, name="DistributedOptimizer.powersgd.state",
                                      process_set=process_set)
            self.state.step = theirs["step"]
            for name, q in theirs["q"].items():
                self.state.q[name].copy_(q)
        self._engine = weakref.ref(engine)

    def compressing(self) -> bool:
        """Whether this step is compressed (decided once per step, the same on every rank)."""
        if self._compressing is None:
            self._enter_world()
            self._compressing = self.state.step >= self.config.start_iter
        return self._compressing

    def submit(self, index: int) -> None:
        """Send bucket ``index``'s phase 1 (once per step)."""
        opt = self._opt
        members = opt._buckets[index]
        if index in self._phase1 or not members:
            return
        grads = []
        for p in members:
            if p.grad is None:  # unused on this rank: it contributes zeros, as on the plain path
                p.grad = torch.zeros_like(p)
            grads.append(sparse.as_dense(p.grad))  # sparse_as_dense: a dense copy is compressed
        bucket = self._buckets.get(index)
        if bucket is None:
            names = [opt._parameter_names[p] for p in members]
            bucket = self._buckets[index] = PowerSGDBucket(self.state, names)
        self._phase1[index] = self._allreduce(bucket.start(grads), f"{opt._bucket_names[index]}.powersgd.p")
        self._sent.append(index)

    def _allreduce(self, buffers: list[torch.Tensor], name: str) -> int:
        opt = self._opt
        return mpi_ops.grouped_allreduce_async_(buffers, name=name, op=opt.op, prescale_factor=opt._prescale,
                                                postscale_factor=opt._postscale, process_set=opt.process_set)

    def _send_second(self) -> None:
        """Phase 1 of the next bucket in sending order is done (or is waited for): send its phase 2."""
        index = self._sent[self._second]
        mpi_ops.synchronize(self._phase1[index])
        buffers = self._buckets[index].middle()
        name = f"{self._opt._bucket_names[index]}.powersgd.q"
        self._phase2[index] = self._allreduce(buffers, name) if buffers else None
        self._second += 1

    def poll(self) -> None:
        """From a gradient hook: send phase 2 of every bucket, in sending order, whose phase 1 is done."""
        while self._second < len(self._sent) and mpi_ops.poll(self._phase1[self._sent[self._second]]):
            self._send_second()

    def synchronize(self) -> None:
        """Send what is left, wait for both phases of every bucket, write the gradients, end the step."""
        opt = self._opt
        for index in range(len(opt._buckets)):
            self.submit(index)
        while self._second < len(self._sent):
            self._send_second()
        for index in self._sent:
            handle = self._phase2[index]
            if handle is not None:
                mpi_ops.synchronize(handle)
            results = self._buckets[index].finish()
            for p, result in zip(opt._buckets[index], results):
                grad = p.grad
                assert grad is not None, "submit gave every member a gradient"
                if grad.is_sparse:  # sparse_as_dense: back to a sparse gradient, as the plain path does
                    p.grad = sparse.like_sparse(result, grad)
                elif result is not grad:
                    grad.copy_(result)
        self.end_step()

    def end_step(self) -> None:
        """This step's gradients were reduced, compressed or not."""
        self.state.advance()
        self.reset_step()

    def reset_step(self) -> None:
        """Forget this step's requests (the optimizer's ``_reset_step``)."""
        self._compressing = None
        self._sent.clear()
        self._phase1.clear()
        self._phase2.clear()
        self._second = 0

    def _world(self) -> tuple[int | None, int | None]:
        if state.engine is None:
            return None, None
        process_set = self._opt.process_set
        return process_set.rank(), process_set.size()

    def state_dict(self) -> dict[str, Any]:
        """This rank's PowerSGD state (``PowerSGDState.state_dict``)."""
        return self.state.state_dict(*self._world())

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Take a saved PowerSGD state (or none: zero error feedback), in this rank's world."""
        self.state.load_state_dict(saved, *self._world())


_GRAFTED = {name: value for name, value in vars(_DistributedOptimizer).items()
            if name not in ("__dict__", "__weakref__", "__annotations__", "__doc__", "__module__")}


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: type[Compressor] | PowerSGDConfig = Compression.none,
                         backward_passes_per_step: int = 1,
                         op: int = mpi_ops.Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set, *,
                         shard_optimizer_state: bool = False) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged (``op``) over the process set.

    Returns an instance of a new subclass of ``type(optimizer)`` (``isinstance`` still holds; LR
    schedulers and GradScaler work) built from ``optimizer.param_groups``; the wrapped optimizer's
    existing ``state`` is not carried over. ``named_parameters`` (usually
    ``model.named_parameters()``) names each allreduce; ``compression`` casts gradients on the wire,
    or, as ``hvd.Compression.powersgd(rank=4)``, sends each gradient matrix as two low-rank factors
    with error feedback (``op`` Average or Sum; state in ``state_dict()["ringtrain_powersgd"]``);
    ``backward_passes_per_step`` accumulates that many backward passes locally before communicating;
    ``gradient_predivide_factor`` splits the averaging into a division before and after the sum;
    ``groups`` (an int, or lists of parameters) allreduces parameters in atomic groups.

    ``shard_optimizer_state=True`` (ZeRO stage 1, beyond Horovod): each trainable parameter is owned by
    one rank of the set, whose optimizer alone keeps that parameter's state and steps it; the updated
    parameters are then exchanged, so every rank holds the whole model after ``step()``. Gradients are
    averaged as without it (GradScaler, clipping, compression and ``backward_passes_per_step`` work the
    same). Per-parameter optimizers only (LBFGS is refused), not with ``op=hvd.Adasum`` nor sparse
    gradients (unless ``sparse_as_dense``). ``state_dict()`` is this rank's shard; ``sharding_report()``
    says what this rank holds. See :mod:`ringtrain.sharding`.
    """
    if gradient_predivide_factor != 1.0 and op != mpi_ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if cast(object, compression) is Compression.powersgd:
        raise ValueError("compression=hvd.Compression.powersgd is the factory, not a configuration. HINT: "
                         "call it: compression=hvd.Compression.powersgd(rank=4).")
    if isinstance(compression, PowerSGDConfig) and op not in (mpi_ops.Average, mpi_ops.Sum):
        raise ValueError(f"op={_OP_NAMES.get(op, repr(op))} cannot be used with {compression}: PowerSGD "
                         "averages (or sums) low-rank factors of the gradients. HINT: use op=hvd.Average or "
                         "op=hvd.Sum with PowerSGD, or another compression (hvd.Compression.none, fp16, "
                         "bf16) with this op.")
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
    if shard_optimizer_state:
        sharding.check_request(optimizer, op)
    if op == mpi_ops.Adasum and mpi_ops.size() > 1:
        # Horovod's delta optimizer: each rank steps locally and the parameter deltas are combined.
        assert not isinstance(compression, PowerSGDConfig), "refused above"
        return DistributedAdasumOptimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                                          process_set)
    base = type(optimizer)
    namespace = dict(_GRAFTED)
    namespace["_ringtrain_base"] = base
    namespace["__module__"] = base.__module__
    namespace["__doc__"] = base.__doc__
    cls = type(base.__name__, (base,), namespace)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set, shard_optimizer_state)


__all__ = ["DistributedOptimizer"]
