"""``LocalSGD``: each rank steps on its own gradients; every ``sync_every`` steps the ranks average what
they learned (Local SGD), optionally through an outer optimizer with Nesterov momentum (DiLoCo).

What it trades. Synchronous data-parallel training exchanges every gradient at every step. Here a rank
exchanges nothing between two averagings: a job on a slow link sends ``sync_every`` times fewer bytes
(and waits on the link ``sync_every`` times less often), at the price of staleness: between two
averagings the ranks' models drift apart, each fitted to its own data, and the average of their moves
is not the step that the averaged gradients would have taken. The larger ``sync_every``, the cheaper
and the staler. Local SGD (Stich 2019; Lin et al. 2020) averages the parameters; DiLoCo (Douillard et
al. 2023, arXiv 2311.08105) treats the averaged move as a gradient (the "outer gradient") for an outer
SGD with Nesterov momentum (lr 0.7, momentum 0.9 in the paper, with ``sync_every`` in the hundreds),
which keeps much of synchronous training's quality at a fraction of the communication.

How. The wrapper keeps a copy of the parameters as of the last averaging, the *anchor* (the same on
every rank). At each averaging, each rank's move since then (``anchor - parameters``) is averaged over
the ranks in one flat buffer per dtype and device (cast to 16 bits on the wire with
``compression=hvd.Compression.fp16`` or ``bf16``); the outer optimizer then steps the anchor with that
mean as its gradient, and every rank's parameters become the new anchor. With the default outer
optimizer (SGD, lr 1, no momentum) that is exactly the mean of the ranks' parameters.

Which link: ringtrain's engine when ``hvd.init()`` was called, else the default ``torch.distributed``
process group (or ``group=``) when one is initialized, else none (one process: the move is applied
as it is).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ringtrain import mpi_ops
from ringtrain.compression import Compression
from ringtrain.functions import broadcast_object
from ringtrain.optimizer_names import unhooked_step

#: The key of ``LocalSGD.state_dict()`` that holds the wrapper's own state (beside the wrapped one's).
STATE_KEY = "ringtrain_local_sgd"

#: What ``outer_optimizer=`` takes: a function from the anchor tensors to a torch optimizer over them.
OuterFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]

_WIRE_DTYPES: dict[str, torch.dtype | None] = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
_DILOCO_HINT = ("outer_lr=1.0 with outer_momentum=0 is Local SGD (the ranks' parameters averaged); "
                "DiLoCo uses outer_lr=0.7, outer_momentum=0.9")


# --- validation -----------------------------------------------------------------------------------

def _sync_every(value: Any) -> int:
    try:
        steps = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        steps = None
    if steps is None or steps < 1:
        raise ValueError(
            f"LocalSGD(sync_every={value!r}): sync_every is the number of local optimizer steps between two "
            "averagings of the ranks' parameters, a positive int. HINT: sync_every=1 averages after every "
            "step (with SGD inside, that is synchronous data-parallel SGD); on a slow link try 8 to 64, or "
            "hundreds as DiLoCo does.")
    return steps


def _outer_number(name: str, value: Any) -> float:
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    fine = math.isfinite(number) and (number > 0 if name == "outer_lr" else 0 <= number < 1)
    if not fine:
        what = ("the outer learning rate scales the averaged parameter delta; it must be a finite number > 0"
                if name == "outer_lr" else
                "the outer (Nesterov) momentum must be a finite number from 0 up to, not including, 1")
        raise ValueError(f"LocalSGD({name}={value!r}): {what}. HINT: {_DILOCO_HINT}.")
    return number


def _compression_name(compression: Any) -> str:
    if compression is None:
        return "none"
    if isinstance(compression, str) and compression in _WIRE_DTYPES:
        return compression
    for name in _WIRE_DTYPES:
        if compression is getattr(Compression, name):
            return name
    shown = getattr(compression, "__name__", None) or repr(compression)
    raise ValueError(
        f"LocalSGD(compression={shown}): the averaged parameter deltas travel as they are or cast to 16 "
        "bits, so compression must be None, hvd.Compression.none, hvd.Compression.fp16 or "
        "hvd.Compression.bf16 (or "
        "'none', 'fp16', 'bf16'). HINT: other compressors are for DistributedOptimizer's gradients; Local "
        "SGD already sends sync_every times fewer bytes: add compression=hvd.Compression.fp16 to halve them.")


def _check_wrappable(optimizer: Any) -> None:
    if isinstance(optimizer, LocalSGD):
        raise ValueError(
            f"LocalSGD(optimizer={type(optimizer).__name__} already wrapped in LocalSGD): one LocalSGD per "
            "optimizer. HINT: wrap the plain torch optimizer once.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"LocalSGD(optimizer={type(optimizer).__name__}): expected a torch.optim.Optimizer. "
                        "HINT: ringtrain.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), "
                        "sync_every=8).")
    if getattr(optimizer, "_ringtrain_base", None) is not None:  # DistributedOptimizer, its Adasum form
        raise ValueError(
            f"LocalSGD(optimizer=hvd.DistributedOptimizer({type(optimizer).__name__})): a "
            "DistributedOptimizer averages the gradients over the ranks at every step, which defeats the "
            "point of Local SGD (ranks step on their own gradients and exchange only every sync_every "
            "steps). HINT: wrap the "
            "plain torch optimizer: ringtrain.LocalSGD(torch.optim.SGD(model.parameters(), lr=...), "
            "sync_every=H), without hvd.DistributedOptimizer.")


def _outer_factory(outer_optimizer: Any, outer_lr: Any, outer_momentum: Any) -> OuterFactory:
    if outer_optimizer is not None:
        if outer_lr is not None or outer_momentum is not None:
            raise ValueError(
                "LocalSGD(outer_optimizer=..., outer_lr=..., outer_momentum=...): give the outer optimizer "
                "either as a function or as the two numbers, not both. HINT: drop outer_lr/outer_momentum, "
                "or drop outer_optimizer to get torch.optim.SGD(lr=outer_lr, momentum=outer_momentum, "
                "nesterov=outer_momentum > 0).")
        if isinstance(outer_optimizer, torch.optim.Optimizer) or not callable(outer_optimizer):
            raise TypeError(
                f"LocalSGD(outer_optimizer={type(outer_optimizer).__name__}): expected a function that "
                "builds the outer optimizer over the tensors it is given (LocalSGD's anchor, its own copy of "
                "the parameters), not an optimizer. HINT: outer_optimizer=lambda params: "
                "torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True).")
        factory: OuterFactory = outer_optimizer
        return factory
    lr = 1.0 if outer_lr is None else _outer_number("outer_lr", outer_lr)
    momentum = 0.0 if outer_momentum is None else _outer_number("outer_momentum", outer_momentum)

    def sgd(params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=momentum > 0)

    return sgd


# --- the link -------------------------------------------------------------------------------------

class _Link:
    """One process: nothing to exchange."""

    world = 1
    rank = 0

    def average_(self, buffers: list[tuple[str, torch.Tensor]]) -> None:
        """Replace each buffer (in place) by its mean over the ranks."""

    def broadcast_(self, tensors: list[tuple[str, torch.Tensor]], root_rank: int) -> None:
        """Overwrite each tensor (in place) with ``root_rank``'s."""

    def broadcast_object(self, obj: Any, root_rank: int, name: str) -> Any:
        """``root_rank``'s picklable object."""
        return obj


class _EngineLink(_Link):
    """ringtrain's engine (``hvd.init()``): named requests, matched across ranks by name."""

    def __init__(self) -> None:
        self.world = mpi_ops.size()
        self.rank = mpi_ops.rank()

    def average_(self, buffers: list[tuple[str, torch.Tensor]]) -> None:
        handles = [mpi_ops.allreduce_async_(t, name=name, op=mpi_ops.Average) for name, t in buffers]
        for handle in handles:
            mpi_ops.synchronize(handle)

    def broadcast_(self, tensors: list[tuple[str, torch.Tensor]], root_rank: int) -> None:
        handles = [mpi_ops.broadcast_async_(t, root_rank, name) for name, t in tensors]
        for handle in handles:
            mpi_ops.synchronize(handle)

    def broadcast_object(self, obj: Any, root_rank: int, name: str) -> Any:
        return broadcast_object(obj, root_rank, name=name)


class _TorchLink(_Link):
    """A ``torch.distributed`` process group (the default one unless ``group=``): gloo, NCCL, ..."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank()

    def average_(self, buffers: list[tuple[str, torch.Tensor]]) -> None:
        works = [dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
                 for _, t in buffers]
        for work, (_, t) in zip(works, buffers):
            if work is not None:
                work.wait()
            t.div_(self.world)

    def broadcast_(self, tensors: list[tuple[str, torch.Tensor]], root_rank: int) -> None:
        works = [dist.broadcast(t, src=root_rank, group=self.group, async_op=True) for _, t in tensors]
        for work in works:
            if work is not None:
                work.wait()

    def broadcast_object(self, obj: Any, root_rank: int, name: str) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=root_rank, group=self.group)
        return box[0]


def _link(group: Any) -> _Link:
    """ringtrain's engine if initialized (and no ``group`` named), else torch.distributed, else none."""
    if group is None and mpi_ops.is_initialized():
        return _EngineLink()
    if dist.is_available() and dist.is_initialized():
        return _TorchLink(group)
    if group is not None:
        raise ValueError("LocalSGD(group=...): a torch.distributed group was named but torch.distributed is "
                         "not initialized. HINT: call torch.distributed.init_process_group first, or leave "
                         "group out.")
    return _Link()


class _Slot(NamedTuple):
    """A tensor of a broadcast state dict, sent beside its pickled skeleton."""

    position: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_cpu: bool


def _strip_tensors(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with each tensor of more than one element replaced by a ``_Slot`` (appended to ``tensors``)."""
    if isinstance(obj, torch.Tensor):
        if obj.numel() <= 1:
            return obj.detach().cpu()
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.device.type == "cpu")
    if isinstance(obj, dict):
        return {key: _strip_tensors(value, tensors) for key, value in obj.items()}
    if isinstance(obj, list | tuple) and not isinstance(obj, _Slot):
        return type(obj)(_strip_tensors(value, tensors) for value in obj)
    return obj


def _fill_tensors(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        return tensors[obj.position]
    if isinstance(obj, dict):
        return {key: _fill_tensors(value, tensors) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_fill_tensors(value, tensors) for value in obj)
    return obj


def _slots(obj: Any) -> list[_Slot]:
    if isinstance(obj, _Slot):
        return [obj]
    if isinstance(obj, dict):
        return [slot for value in obj.values() for slot in _slots(value)]
    if isinstance(obj, list | tuple):
        return [slot for value in obj for slot in _slots(value)]
    return []


# --- the optimizer --------------------------------------------------------------------------------

_SUBCLASSES: dict[type, type[LocalSGD]] = {}


def _subclass_for(base: type[torch.optim.Optimizer]) -> type[LocalSGD]:
    """``LocalSGD`` over the user's optimizer class: ``isinstance`` holds for both; named like ``base``."""
    cls = _SUBCLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (LocalSGD, base), {"__module__": base.__module__, "_local_base": base})
        _SUBCLASSES[base] = cls
    return cls


class LocalSGD(torch.optim.Optimizer):
    """Wrap ``optimizer`` so that ranks step locally and average what they learned every ``sync_every`` steps.

    ``ringtrain.LocalSGD(optimizer, sync_every=H)`` returns an instance of a subclass of both
    ``LocalSGD`` and ``type(optimizer)`` (``isinstance`` holds for either; LR schedulers and GradScaler
    work), built from ``optimizer.param_groups`` and carrying over its ``state``; use it instead of
    ``optimizer``. ``step()`` runs the wrapped optimizer on this rank's own gradients (no allreduce) and,
    every ``sync_every``-th call, :meth:`sync`: the ranks' parameter moves since the last averaging are
    averaged and applied through the outer optimizer, after which every rank holds the same parameters.

    - ``sync_every``: local steps between two averagings (a positive int). 1 with SGD inside is
      synchronous data-parallel SGD (up to rounding); larger values send that many times fewer bytes, and
      let the ranks' models drift apart for longer (staler averages).
    - ``outer_optimizer``: a function ``params -> torch.optim.Optimizer``, called once with the anchor
      tensors (e.g. ``functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)``), or
      leave it out and give ``outer_lr`` / ``outer_momentum``: ``torch.optim.SGD(lr=outer_lr,
      momentum=outer_momentum, nesterov=outer_momentum > 0)``; neither: SGD with lr 1, which is plain
      Local SGD (the mean of the ranks' parameters). :meth:`diloco` gives DiLoCo's defaults.
    - ``model``: its floating-point buffers (BatchNorm's running statistics) are averaged too at each
      averaging (their values, at their own dtype); integer buffers (``num_batches_tracked``) stay as
      they are.
    - ``compression``: ``hvd.Compression.fp16`` or ``bf16`` casts the parameter deltas to 16 bits on the
      wire (None or ``Compression.none``: as they are; the strings ``'none'``, ``'fp16'``, ``'bf16'``
      also do).
    - ``group``: a ``torch.distributed`` process group to average over (e.g. an NCCL group beside a gloo
      default group); it also makes the wrapper use torch.distributed when ringtrain's engine is up.

    Every rank must start from the same parameters (broadcast them, as with Horovod: e.g.
    ``hvd.broadcast_parameters(model.state_dict(), 0)``, or :meth:`broadcast_state`); the anchor is taken
    here. Every rank must call ``step()`` equally often: the averaging is a collective. Under a GradScaler
    a step it skips on one rank (an inf/NaN gradient there) still counts, so the ranks stay in step.

    ``hvd.broadcast_optimizer_state(opt, root_rank)`` (and so ``hvd.elastic.TorchState``, after a reset)
    also gives every rank ``root_rank``'s parameters as its anchor, and its step count and outer
    optimizer state. ``state_dict()`` holds the wrapped optimizer's state and, under
    ``"ringtrain_local_sgd"``, the wrapper's (see :meth:`state_dict`).

    Only parameters that require gradients (when the wrapper is built, or added with
    ``add_param_group``) are averaged. Gradient accumulation is the caller's: call ``step()`` once per
    accumulated batch.
    """

    #: GradScaler calls ``step()`` even after an inf/NaN gradient (and says so): a skipped step still counts.
    _step_supports_amp_scaling = True
    #: The user's optimizer class (set on each subclass by ``_subclass_for``).
    _local_base: type[torch.optim.Optimizer]

    def __new__(cls, optimizer: torch.optim.Optimizer, sync_every: int,
                outer_optimizer: OuterFactory | None = None, model: torch.nn.Module | None = None,
                compression: Any = None, *, outer_lr: float | None = None,
                outer_momentum: float | None = None, group: Any = None) -> LocalSGD:
        if cls is not LocalSGD:  # a subclass made by _subclass_for: plain allocation
            return super().__new__(cls)
        _check_wrappable(optimizer)
        return object.__new__(_subclass_for(type(optimizer)))

    def __init__(self, optimizer: torch.optim.Optimizer, sync_every: int,
                 outer_optimizer: OuterFactory | None = None, model: torch.nn.Module | None = None,
                 compression: Any = None, *, outer_lr: float | None = None,
                 outer_momentum: float | None = None, group: Any = None) -> None:
        # everything is checked before anything is built: the same error on every rank, no collective
        if not isinstance(optimizer, torch.optim.Optimizer):  # e.g. DistributedOptimizer(LocalSGD(...))
            raise TypeError(
                f"LocalSGD was given {type(optimizer).__name__} where it wraps an optimizer: a LocalSGD "
                "inside hvd.DistributedOptimizer would average gradients at every step, which defeats "
                "Local SGD. HINT: use the LocalSGD alone, without hvd.DistributedOptimizer.")
        steps = _sync_every(sync_every)
        factory = _outer_factory(outer_optimizer, outer_lr, outer_momentum)
        compression_name = _compression_name(compression)
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"LocalSGD(model={type(model).__name__}): expected the torch.nn.Module whose "
                            "buffers are averaged with the parameters. HINT: model=model, or leave it out.")
        # the user's optimizer class, whose __init__ defaults every hyperparameter (torch.optim's all do)
        base_init: Callable[..., None] = self._local_base.__init__
        base_init(self, optimizer.param_groups)
        for param, state in optimizer.state.items():
            self.state[param] = state
        self._local_every = steps
        self._local_compression = compression_name
        self._local_model = model
        self._local_group = group
        self._local_steps = 0
        self._local_syncs = 0
        self._local_params: list[torch.Tensor] = [p for g in self.param_groups for p in g["params"]
                                            if p.requires_grad]
        self._local_anchors: list[torch.Tensor] = [p.detach().clone() for p in self._local_params]
        outer = factory(list(self._local_anchors))
        if not isinstance(outer, torch.optim.Optimizer):
            raise TypeError(f"LocalSGD(outer_optimizer=...): the function returned {type(outer).__name__}, "
                            "not a torch.optim.Optimizer. HINT: outer_optimizer=lambda params: "
                            "torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True).")
        held = [p for g in outer.param_groups for p in g["params"]]
        anchors = self._local_anchors
        if {id(p) for p in held} != {id(a) for a in anchors} or len(held) != len(anchors):
            raise ValueError("LocalSGD(outer_optimizer=...): the outer optimizer must hold exactly the "
                             "tensors it was given (the anchor). HINT: build it over its argument: "
                             "lambda params: torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True).")
        self._local_outer = outer

    @staticmethod
    def diloco(optimizer: torch.optim.Optimizer, sync_every: int, outer_lr: float = 0.7,
               outer_momentum: float = 0.9, model: torch.nn.Module | None = None, compression: Any = None,
               group: Any = None) -> LocalSGD:
        """DiLoCo: ``LocalSGD`` whose outer optimizer is SGD with Nesterov momentum (the paper's 0.7, 0.9).

        The paper pairs an AdamW inner optimizer with ``sync_every`` in the hundreds.
        """
        return LocalSGD(optimizer, sync_every, model=model, compression=compression, outer_lr=outer_lr,
                        outer_momentum=outer_momentum, group=group)

    # --- what it holds ---------------------------------------------------------------------------

    @property
    def sync_every(self) -> int:
        """Local steps between two averagings (may be changed; every rank alike)."""
        return self._local_every

    @sync_every.setter
    def sync_every(self, value: int) -> None:
        self._local_every = _sync_every(value)

    @property
    def steps(self) -> int:
        """Local steps taken (calls of ``step()``, skipped ones included); it averages when
        ``steps % sync_every == 0``."""
        return self._local_steps

    @property
    def syncs(self) -> int:
        """Averagings done (scheduled and explicit)."""
        return self._local_syncs

    @property
    def outer_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer over the anchor (e.g. for an LR schedule of the outer learning rate)."""
        return self._local_outer

    @property
    def compression(self) -> str:
        """``'none'``, ``'fp16'`` or ``'bf16'``: how the deltas travel."""
        return self._local_compression

    def config(self) -> dict[str, Any]:
        """The settings, as plain values (also saved in ``state_dict()``)."""
        group = self._local_outer.param_groups[0] if self._local_outer.param_groups else {}

        def plain(value: Any) -> Any:
            return value.item() if isinstance(value, torch.Tensor) else value

        return {"sync_every": self._local_every, "outer": type(self._local_outer).__name__,
                "outer_lr": plain(group.get("lr")), "outer_momentum": plain(group.get("momentum")),
                "nesterov": group.get("nesterov"), "compression": self._local_compression,
                "model_buffers": self._local_model is not None}

    def anchor_state(self) -> list[torch.Tensor]:
        """Copies of the anchor: the parameters as of the last averaging, in the order of the parameters
        that require gradients in ``param_groups``. The same on every rank."""
        return [a.detach().clone() for a in self._local_anchors]

    @torch.no_grad()
    def reset_to_anchor(self) -> None:
        """Set the parameters to the anchor, dropping this rank's moves since the last averaging.

        After loading a state dict saved by one rank (a resume, possibly at another world size), this
        starts every rank from the last averaged parameters.
        """
        for p, a in zip(self._local_params, self._local_anchors):
            p.copy_(a)

    # --- stepping --------------------------------------------------------------------------------

    def _ringtrain_inner_step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The wrapped optimizer's step alone: not counted, never averaging, without the step hooks (they
        run once, around ``step()``). ``hvd.broadcast_optimizer_state`` takes its zero-gradient step here."""
        step = unhooked_step(self._local_base)
        return step(self) if closure is None else step(self, closure)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step the wrapped optimizer on this rank's gradients; average (:meth:`sync`) every
        ``sync_every``-th call. Under a GradScaler that found inf/NaN gradients the step is skipped but
        counted, so every rank still averages at the same call."""
        # GradScaler (see _step_supports_amp_scaling) sets these two for the call and deletes them after.
        grad_scale = self.__dict__.pop("grad_scale", None)
        found_inf = self.__dict__.pop("found_inf", None)
        try:
            skip = found_inf is not None and bool(found_inf.item())
            if grad_scale is not None and not skip:
                self._unscale(grad_scale)
            loss = None if skip else self._ringtrain_inner_step(closure)
        finally:
            if found_inf is not None:
                self.__dict__.update(grad_scale=grad_scale, found_inf=found_inf)
        self._local_steps += 1
        if self._local_steps % self._local_every == 0:
            self.sync()
        return loss

    @torch.no_grad()
    def _unscale(self, grad_scale: torch.Tensor) -> None:
        """Divide the gradients by GradScaler's scale (it left them scaled for this optimizer)."""
        inverse = grad_scale.double().reciprocal().float()
        dense: dict[torch.device, list[torch.Tensor]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    p.grad.mul_(inverse.to(p.grad.device))
                else:
                    dense.setdefault(p.grad.device, []).append(p.grad)
        for device, grads in dense.items():
            torch._foreach_mul_(grads, inverse.to(device))

    # --- averaging -------------------------------------------------------------------------------

    def _float_buffers(self) -> list[torch.Tensor]:
        if self._local_model is None:
            return []
        return [b for b in self._local_model.buffers() if b.is_floating_point()]

    @torch.no_grad()
    def sync(self) -> None:
        """Average now: the outer step on the ranks' mean move since the last averaging (and the mean of the
        model's floating buffers); afterwards every rank's parameters equal the new anchor.

        ``step()`` calls it every ``sync_every`` steps; call it yourself for an averaging out of schedule
        (before an evaluation or a snapshot), on every rank alike: it is a collective. It does not move the
        schedule.
        """
        link = _link(self._local_group)
        wire = _WIRE_DTYPES[self._local_compression] if link.world > 1 else None
        sizes: dict[tuple[torch.dtype, torch.device], int] = {}

        def place(t: torch.Tensor, dtype: torch.dtype) -> tuple[tuple[torch.dtype, torch.device], int]:
            key = (dtype, t.device)
            offset = sizes.get(key, 0)
            sizes[key] = offset + t.numel()
            return key, offset

        deltas = [place(p, wire if wire is not None and p.is_floating_point() else p.dtype)
                  for p in self._local_params]
        buffers = self._float_buffers() if link.world > 1 else []
        buffer_places = [place(b, b.dtype) for b in buffers]
        flats = {key: torch.empty(size, dtype=key[0], device=key[1]) for key, size in sizes.items()}

        def view(key: tuple[torch.dtype, torch.device], offset: int, like: torch.Tensor) -> torch.Tensor:
            return flats[key][offset:offset + like.numel()].view(like.shape)

        for p, a, (key, offset) in zip(self._local_params, self._local_anchors, deltas):
            torch.sub(a, p.detach(), out=view(key, offset, p))
        for b, (key, offset) in zip(buffers, buffer_places):
            view(key, offset, b).copy_(b)
        if link.world > 1:
            link.average_([(f"LocalSGD.{i}.{str(dtype).removeprefix('torch.')}.{flat.numel()}", flat)
                           for i, ((dtype, _), flat) in enumerate(flats.items())])
        for a, (key, offset) in zip(self._local_anchors, deltas):
            mean = view(key, offset, a)
            a.grad = mean if mean.dtype == a.dtype else mean.to(a.dtype)
        self._local_outer.step()
        for p, a in zip(self._local_params, self._local_anchors):
            a.grad = None
            p.copy_(a)
        for b, (key, offset) in zip(buffers, buffer_places):
            b.copy_(view(key, offset, b))
        self._local_syncs += 1

    @torch.no_grad()
    def broadcast_state(self, root_rank: int = 0) -> None:
        """Give every rank ``root_rank``'s parameters, as its anchor too, and its step and averaging counts
        and outer optimizer state (a collective). The wrapped optimizer's own state is not included:
        ``hvd.broadcast_optimizer_state(opt, root_rank)`` does both (and calls this).

        Call it where every rank must start from one state: the start of training, or after an elastic
        reset (``hvd.elastic.TorchState`` does, through ``broadcast_optimizer_state``).
        """
        link = _link(self._local_group)
        if link.world > 1:
            link.broadcast_([(f"LocalSGD.param.{i}", p.detach()) for i, p in enumerate(self._local_params)],
                            root_rank)
            tensors: list[torch.Tensor] = []
            mine = {"steps": self._local_steps, "syncs": self._local_syncs,
                    "outer": _strip_tensors(self._local_outer.state_dict(), tensors)}
            skeleton = link.broadcast_object(mine, root_rank, "LocalSGD.state")
            if link.rank != root_rank:
                device = self._local_anchors[0].device if self._local_anchors else torch.device("cpu")
                tensors = [torch.empty(slot.shape, dtype=slot.dtype,
                                       device=torch.device("cpu") if slot.on_cpu else device)
                           for slot in sorted(_slots(skeleton["outer"]), key=lambda slot: slot.position)]
            link.broadcast_([(f"LocalSGD.outer.{i}", t) for i, t in enumerate(tensors)], root_rank)
            if link.rank != root_rank:
                self._local_steps, self._local_syncs = int(skeleton["steps"]), int(skeleton["syncs"])
                self._local_outer.load_state_dict(_fill_tensors(skeleton["outer"], tensors))
        for p, a in zip(self._local_params, self._local_anchors):
            a.copy_(p)

    def _ringtrain_broadcast_state(self, root_rank: int) -> None:
        """What ``hvd.broadcast_optimizer_state`` calls after broadcasting the wrapped optimizer's state."""
        self.broadcast_state(root_rank)

    # --- state -----------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the wrapped optimizer; its parameters join the anchor as they are now (every rank
        must add the same values)."""
        super().add_param_group(param_group)
        if "_local_anchors" not in self.__dict__:  # the base class's __init__ adding the first groups
            return
        new = [p for p in self.param_groups[-1]["params"] if p.requires_grad]
        anchors = [p.detach().clone() for p in new]
        self._local_params.extend(new)
        self._local_anchors.extend(anchors)
        if anchors:
            self._local_outer.add_param_group({"params": anchors})

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict plus ``"ringtrain_local_sgd"``: ``sync_every``, ``steps`` (local
        steps taken), ``syncs``, ``anchor`` (a list of tensors, references), ``outer`` (the outer optimizer's
        state dict) and ``config`` (see :meth:`config`).

        The wrapped optimizer's state and the parameters differ between ranks between two averagings; the
        rest is the same on every rank.
        """
        state = super().state_dict()
        state[STATE_KEY] = {"sync_every": self._local_every, "steps": self._local_steps,
                            "syncs": self._local_syncs, "anchor": list(self._local_anchors),
                            "outer": self._local_outer.state_dict(), "config": self.config()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (a plain optimizer's state dict loads the wrapped optimizer
        only). ``sync_every`` stays as constructed: the schedule continues from the saved step count. The
        parameters are not touched (load the model's own state, or call :meth:`reset_to_anchor`)."""
        state_dict = dict(state_dict)
        mine = state_dict.pop(STATE_KEY, None)
        if mine is not None:
            saved = list(mine["anchor"])
            shapes = [tuple(t.shape) for t in saved]
            ours = [tuple(a.shape) for a in self._local_anchors]
            if shapes != ours:
                raise ValueError(
                    f"LocalSGD.load_state_dict: the saved anchor has {len(saved)} tensors of shapes "
                    f"{shapes[:4]}{'...' if len(shapes) > 4 else ''}, this optimizer averages {len(ours)} "
                    f"parameters of shapes {ours[:4]}{'...' if len(ours) > 4 else ''}. HINT: build the "
                    "optimizer over the same parameters, in the same order, as the one that saved it.")
        super().load_state_dict(state_dict)
        if mine is None:
            return
        with torch.no_grad():
            for a, t in zip(self._local_anchors, mine["anchor"]):
                a.copy_(t)
        self._local_outer.load_state_dict(mine["outer"])
        self._local_steps = int(mine["steps"])
        self._local_syncs = int(mine["syncs"])


__all__ = ["STATE_KEY", "LocalSGD"]
