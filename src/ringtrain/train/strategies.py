"""How gradients meet: torch DistributedDataParallel, or ringtrain's Horovod DistributedOptimizer.

A strategy owns the process group it starts, the device of this rank, and the few operations the
Trainer needs from it: wrap the model and optimizer, skip gradient sync on accumulating passes, take
an optimizer step (with or without a GradScaler), sum a tensor over ranks.

How the gradients travel is the strategy's too (:mod:`ringtrain.exchange`): as they are, cast to 16
bits, as PowerSGD's low-rank factors (ringtrain's in the Horovod strategy, torch's comm hook in DDP),
or not at all between Local SGD's averagings of the parameters (``LocalSGDSettings``). What of that
differs from rank to rank (error feedback, parameters between averagings) is the strategy's
:meth:`Strategy.rank_state`, which snapshots keep in one part per rank.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtrain.env import detect_environment
from ringtrain.exchange import Method, parse_compression
from ringtrain.train.logs import LOGGER_NAME

#: The key of PowerSGD's state in the Horovod strategy's optimizer state (ringtrain.optimizer's).
POWERSGD_KEY = "ringtrain_powersgd"
#: The key of a rank's shard of the optimizer state in its snapshot part (sharded optimizer state).
SHARD_KEY = "optimizer_shard"
#: Bytes of the link probe's two allreduces (``--compression auto``): latency-bound, bandwidth-bound.
PROBE_BYTES = (4 << 10, 4 << 20)
PROBE_REPEATS = 3


@dataclass(frozen=True)
class LocalSGDSettings:
    """Local SGD's averaging: every ``sync_every`` steps, through an outer SGD step (DiLoCo: Nesterov)."""

    sync_every: int
    outer_lr: float = 1.0
    outer_momentum: float = 0.0


def pick_device(requested: str | None, local_rank: int) -> torch.device:
    """The device of this rank: a GPU chosen by local rank when CUDA is there (and not refused)."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device. HINT: use device='cpu' "
                         "(or --device cpu), or install a CUDA build of torch.")
    if requested != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


class Strategy(ABC):
    """The distributed side of a Trainer."""

    name = "base"

    def __init__(self, device: str | None = None, fp16_allreduce: bool = False,
                 batches_per_allreduce: int = 1, elastic: bool = False, compression: str = "none",
                 local_sgd: LocalSGDSettings | None = None, shard_optimizer: bool = False) -> None:
        self.requested_device = device
        #: Each parameter's optimizer state on one rank only (ZeRO stage 1).
        self.shard_optimizer = shard_optimizer
        #: What ``prepare`` found of the optimizer's state on this rank, for the log (sharded only).
        self.sharding_note: str | None = None
        #: The Trainer runs inside ``hvd.elastic.run``: the first sync spreads rank 0's state instead of
        #: ``prepare`` (a worker joining a running group must not call collectives the others don't).
        self.elastic = elastic
        self.fp16_allreduce = fp16_allreduce
        self.batches_per_allreduce = batches_per_allreduce
        #: How gradients travel; ``auto`` until :meth:`decide` replaced it (before ``prepare``).
        self.method: Method = parse_compression("fp16" if fp16_allreduce and compression in ("none", "fp16")
                                                else compression)
        self.local_sgd = local_sgd
        self.rank = 0
        self.world_size = 1
        self.local_rank = 0
        self.local_world_size = 1
        self.device = torch.device("cpu")

    @abstractmethod
    def setup(self) -> None:
        """Join the job: start communication, learn rank and size, pick the device."""

    @abstractmethod
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """The model to call in training and the optimizer to step (both possibly wrapped)."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain model inside what ``prepare`` returned."""
        return model

    @contextlib.contextmanager
    def accumulating(self, model: nn.Module, sync: bool) -> Iterator[None]:
        """Context of one forward/backward; ``sync`` False on passes whose gradients only accumulate."""
        yield

    @abstractmethod
    def step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        """Average gradients (if not already) and apply the optimizer."""

    @abstractmethod
    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over all ranks (a new CPU tensor)."""

    def sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Start :meth:`sum`; the returned function waits for it (collective: same order on every rank)."""
        result = self.sum(tensor)
        return lambda: result

    # --- how gradients travel -------------------------------------------------------------------

    @property
    def wire_cast(self) -> str:
        """``none``, ``fp16`` or ``bf16``: the per-element cast of what travels (Local SGD's deltas too)."""
        return self.method.name if self.method.name in ("fp16", "bf16") else "none"

    def measure_link(self) -> tuple[float, float]:
        """(latency s, bandwidth bytes/s) of an allreduce over every rank, fitted from two sizes timed
        with :meth:`sum` (collective; every rank gets the same figures: the times are averaged)."""
        times = []
        for nbytes in PROBE_BYTES:
            work = torch.zeros(nbytes // 4, dtype=torch.float32)
            self.sum(work)  # the first of a size sets up buffers: not timed
            samples = []
            for _ in range(PROBE_REPEATS):
                start = time.perf_counter()
                self.sum(work)
                samples.append(time.perf_counter() - start)
            times.append(statistics.median(samples))
        mean = self.sum(torch.tensor(times, dtype=torch.float64)) / self.world_size
        small, large = (float(t) for t in mean)
        p = self.world_size
        ring = 2 * (p - 1) / p
        beta = ring * (PROBE_BYTES[1] - PROBE_BYTES[0]) / max(large - small, 1e-9)
        alpha = max(0.0, small - ring * PROBE_BYTES[0] / beta) / (2 * (p - 1))
        return alpha, beta

    def decide(self, model: nn.Module) -> str | None:
        """Settle ``--compression auto`` for ``model`` on the measured link (collective); returns the line
        that says what was chosen and why (None when nothing was left to decide)."""
        if self.method.name != "auto":
            return None
        from ringtrain.exchange import choose

        shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
        if self.world_size <= 1:
            alpha, beta = 0.0, float("inf")
        else:
            alpha, beta = self.measure_link()
        choice = choose(shapes, self.world_size, alpha, beta)
        self.method = choice.method
        return f"--compression auto: {choice.method.compression} ({choice.reason})"

    def rank_state(self, model: nn.Module, optimizer: Any) -> dict[str, Any] | None:
        """What this rank holds of its own that a snapshot must keep (None: nothing; the same on every
        rank). Local SGD: the rank's parameters and optimizer between two averagings."""
        if self.local_sgd is None:
            return None
        return {"model": self.unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}

    def shared_optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The optimizer's state as rank 0 writes it into a snapshot (without what is per rank)."""
        return dict(optimizer.state_dict())

    def restore(self, model: nn.Module, optimizer: Any, body: Mapping[str, Any],
                parts: Sequence[Mapping[str, Any]], mine: bool) -> str | None:
        """Load a snapshot's model and optimizer state, with what :meth:`rank_state` saved: ``parts`` holds
        this rank's part when ``mine``, else every rank's of a world of another size (or none). Returns a
        note for the log, or None."""
        model_state, optimizer_state = body["model"], body["optimizer"]
        local = self.local_sgd is not None and parts and "model" in parts[0]
        if local and mine:
            model_state, optimizer_state = parts[0]["model"], parts[0]["optimizer"]
        self.unwrap(model).load_state_dict(model_state)
        if parts and SHARD_KEY in parts[0]:
            optimizer_state = self._from_shards([part[SHARD_KEY] for part in parts], mine)
        optimizer.load_state_dict(self._with_rank_state(optimizer_state, parts, mine))
        if local and not mine:
            # another world: every rank starts from the parameters of the last averaging
            optimizer.reset_to_anchor()
            return ("Local SGD: the snapshot was written by another number of ranks, so every rank starts "
                    "from the parameters of its last averaging")
        return None

    def _with_rank_state(self, optimizer_state: Any, parts: Sequence[Mapping[str, Any]],
                         mine: bool) -> Any:
        """The optimizer state to load, with a strategy's own per-rank entries put back (none here)."""
        return optimizer_state

    def wants_every_part(self, own: Mapping[str, Any]) -> bool:
        """Whether, beside this rank's own part ``own`` of a snapshot of as many ranks, this rank needs
        every rank's: to consolidate shards of the optimizer state into an unsharded one."""
        return SHARD_KEY in own

    def _from_shards(self, shards: list[Any], mine: bool) -> Any:
        """What to load from the shards of a run with sharded optimizer state (each rank's part): this
        strategy's optimizer takes them consolidated (as one unsharded state dict)."""
        from ringtrain.sharding import consolidate

        return consolidate(shards)

    def end_epoch(self, optimizer: Any) -> None:
        """At an epoch's end, before evaluation and snapshots: Local SGD averages the ranks' parameters,
        so that every rank evaluates and saves the same model (collective)."""
        if self.local_sgd is not None:
            optimizer.sync()

    def _local_sgd(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None) -> Any:
        """``optimizer`` wrapped by Local SGD; ``group``: the torch.distributed group to average over
        (None: ringtrain's engine where it runs, else torch's default group)."""
        from ringtrain.compression import Compression
        from ringtrain.local_sgd import LocalSGD

        settings = self.local_sgd
        assert settings is not None
        return LocalSGD(optimizer, sync_every=settings.sync_every, outer_lr=settings.outer_lr,
                        outer_momentum=settings.outer_momentum, model=model,
                        compression=getattr(Compression, self.wire_cast), group=group)

    @abstractmethod
    def teardown(self, wait_for_peers: bool = True) -> None:
        """Leave the job (only what ``setup`` started); ``wait_for_peers`` False: without the last barrier
        (leaving on an exception the other ranks may not share: they may never reach it).

        Drop what ``prepare`` returned first: a DDP wrapper freed after its process group is destroyed
        can hang in gloo's destructor (``Trainer.close`` unwraps and collects before calling this).
        """


def step_optimizer(optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
    """Apply ``optimizer`` to gradients that need no further exchange (through ``scaler`` under AMP)."""
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()


class DDPStrategy(Strategy):
    """torch DistributedDataParallel: gloo on CPU, NCCL on CUDA (gloo where ranks share a GPU).

    The default process group is gloo; on CUDA, an NCCL group of all ranks carries the gradients and
    ``sum``, unless two ranks use one GPU (more ranks than GPUs on a host), which NCCL refuses
    ("Duplicate GPU detected"): then gloo moves the CUDA tensors, through host memory.
    """

    name = "ddp"

    def __init__(self, *args: Any, timeout_s: float = 600.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_s = timeout_s
        self._owns_group = False
        #: The group DDP and ``sum`` use (None: the default group).
        self.group: Any = None
        #: torch's PowerSGD hook and its state, with ``compression`` powersgd.
        self._powersgd: Any = None

    def setup(self) -> None:
        placement = detect_environment().placement()
        self.local_rank = placement.local_rank
        self.local_world_size = placement.local_world_size
        self.device = pick_device(self.requested_device, self.local_rank)
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            return
        self.rank, self.world_size = placement.rank, placement.world_size
        if self.world_size == 1:
            return
        env_ready = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT"))
        # env:// lets torchrun's agent share its store; otherwise go to the detected main address
        init_method = "env://" if env_ready else f"tcp://{placement.main_address}:{placement.main_port}"
        dist.init_process_group("gloo", init_method=init_method, rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=self.timeout_s))
        self._owns_group = True
        if self.device.type == "cuda":
            sharing = ranks_sharing_gpus(self.device)
            if not sharing:
                self.group = dist.new_group(backend="nccl", timeout=timedelta(seconds=self.timeout_s))
            elif self.rank == 0:
                logging.getLogger(LOGGER_NAME).warning(
                    "ranks %s share GPUs: NCCL refuses two ranks on one GPU, so DDP's gradients go "
                    "through host memory on gloo, at CPU speed. HINT: start at most one rank per GPU "
                    "(-np no more than the GPUs of each host) for NCCL.", sharing)

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        if self.local_sgd is not None:
            # no DDP: gradients stay on their rank; the ranks start alike and average every few steps
            if self.world_size > 1:
                for tensor in model.state_dict().values():
                    dist.broadcast(tensor, src=0, group=self.group)
            return model, self._local_sgd(model, optimizer, group=self.group)  # NCCL's on CUDA
        if self.world_size == 1:
            return model, optimizer
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=self.group)
        if self.shard_optimizer:
            optimizer = self._zero(optimizer)
        if self.method.name == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            wrapped.register_comm_hook(self.group, default_hooks.fp16_compress_hook)
        elif self.method.name == "bf16":
            # torch's own bf16 hook refuses every group but NCCL's; gloo reduces bfloat16 as well
            from ringtrain.train.ddp_hooks import bf16_hook

            wrapped.register_comm_hook(self.group, bf16_hook)
        elif self.method.name == "powersgd":
            from ringtrain.train.ddp_hooks import DDPPowerSGD

            self._powersgd = DDPPowerSGD(wrapped, self.group, rank=self.method.rank or 4)
        return wrapped, optimizer

    def _zero(self, optimizer: torch.optim.Optimizer) -> Any:
        """torch's ZeroRedundancyOptimizer in place of ``optimizer``: its class, its settings, its groups."""
        from torch.distributed.optim import ZeroRedundancyOptimizer

        from ringtrain.sharding import check_request

        check_request(optimizer, op=-1)
        groups = optimizer.param_groups
        # the first group's settings that the class's constructor takes (a group also holds derived
        # entries, such as AdamW's decoupled_weight_decay, that its constructor does not)
        accepted = inspect.signature(type(optimizer).__init__).parameters
        first = {k: v for k, v in groups[0].items() if k != "params" and k in accepted}
        zero = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=type(optimizer),
                                       process_group=self.group, **first)
        zero.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        for group in groups[1:]:
            zero.add_param_group(dict(group))
        self._note_zero(zero)
        return zero

    def _note_zero(self, zero: Any) -> None:
        total = sum(p.numel() for group in zero.param_groups for p in group["params"])
        self.sharding_note = (f"optimizer state sharded over {self.world_size} ranks by torch's "
                              f"ZeroRedundancyOptimizer ({total:,} parameters)")

    def shared_optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if not self._is_zero(optimizer):
            return super().shared_optimizer_state(optimizer)
        # consolidated on rank 0, which writes the snapshot (collective: every rank sends its shard)
        optimizer.consolidate_state_dict(to=0)
        return dict(optimizer.state_dict()) if self.rank == 0 else {}

    @staticmethod
    def _is_zero(optimizer: Any) -> bool:
        return type(optimizer).__name__ == "ZeroRedundancyOptimizer"

    def rank_state(self, model: nn.Module, optimizer: Any) -> dict[str, Any] | None:
        if self._powersgd is not None:
            return {"ddp_powersgd": self._powersgd.state_dict()}
        return super().rank_state(model, optimizer)

    def restore(self, model: nn.Module, optimizer: Any, body: Mapping[str, Any],
                parts: Sequence[Mapping[str, Any]], mine: bool) -> str | None:
        note = super().restore(model, optimizer, body, parts, mine)
        if self._powersgd is not None and parts and "ddp_powersgd" in parts[0]:
            from ringtrain.train.ddp_hooks import merge

            states = [part["ddp_powersgd"] for part in parts]
            self._powersgd.load_state_dict(states[0] if mine else merge(states))
        return note

    def unwrap(self, model: nn.Module) -> nn.Module:
        return getattr(model, "module", model)

    @contextlib.contextmanager
    def accumulating(self, model: nn.Module, sync: bool) -> Iterator[None]:
        no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel's; the plain model has none
        if sync or no_sync is None:
            yield
        else:
            with no_sync():
                yield

    def step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        step_optimizer(optimizer, scaler)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor.detach().cpu().clone()
        work = tensor.detach().to(self.device).clone()
        dist.all_reduce(work, op=dist.ReduceOp.SUM, group=self.group)
        return work.cpu()

    def sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        if self.world_size == 1:
            return super().sum_async(tensor)
        # a CPU tensor on the default (gloo) group: it runs beside the step's NCCL or gloo traffic
        work_tensor = tensor.detach().cpu().clone()
        work = dist.all_reduce(work_tensor, op=dist.ReduceOp.SUM, async_op=True)

        def wait() -> torch.Tensor:
            work.wait()
            return work_tensor
        return wait

    def teardown(self, wait_for_peers: bool = True) -> None:
        if self._owns_group and dist.is_initialized():
            if wait_for_peers:
                dist.barrier()
            dist.destroy_process_group()
        self._owns_group = False
        self.group = None
        self._powersgd = None


def ranks_sharing_gpus(device: torch.device) -> list[int]:
    """The ranks of the default group whose GPU another rank uses too (empty when none; collective)."""
    from ringtrain.engine.executor import gpu_identity

    index = device.index if device.index is not None else torch.cuda.current_device()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, gpu_identity(index))
    return [rank for rank, gpu in enumerate(everyone) if everyone.count(gpu) > 1]


class HorovodStrategy(Strategy):
    """ringtrain's Horovod API: DistributedOptimizer (optional fp16 compression, local accumulation)
    and a broadcast of parameters and optimizer state from rank 0."""

    name = "horovod"
    _hvd: Any = None  # the API module once setup() has initialized it

    def setup(self) -> None:
        from ringtrain import mpi_ops

        self._hvd = mpi_ops
        mpi_ops.init()
        self.rank, self.world_size = mpi_ops.rank(), mpi_ops.size()
        self.local_rank, self.local_world_size = mpi_ops.local_rank(), mpi_ops.local_size()
        self.device = pick_device(self.requested_device, self.local_rank)

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        from ringtrain.compression import Compression
        from ringtrain.functions import broadcast_optimizer_state, broadcast_parameters
        from ringtrain.optimizer import DistributedOptimizer

        if self.local_sgd is not None:
            # the ranks' parameters agree before Local SGD takes them as its first anchor
            if not self.elastic:
                broadcast_parameters(model.state_dict(), root_rank=0)
            wrapped = self._local_sgd(model, optimizer)
        else:
            if self.method.name == "powersgd":
                compression: Any = Compression.powersgd(rank=self.method.rank or 4)
            else:
                compression = getattr(Compression, self.wire_cast)
            wrapped = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                           compression=compression,
                                           backward_passes_per_step=self.batches_per_allreduce,
                                           shard_optimizer_state=self.shard_optimizer)
            if not self.elastic:
                broadcast_parameters(model.state_dict(), root_rank=0)
        if not self.elastic:
            broadcast_optimizer_state(wrapped, root_rank=0)
        if self.shard_optimizer and self.local_sgd is None:
            self.sharding_note = str(wrapped.sharding_report())  # collective
        return model, wrapped

    def rank_state(self, model: nn.Module, optimizer: Any) -> dict[str, Any] | None:
        if self.shard_optimizer and self.local_sgd is None:
            return {SHARD_KEY: optimizer.state_dict()}  # its shard, with its PowerSGD state if any
        if self.method.name == "powersgd" and self.local_sgd is None:
            return {"powersgd": optimizer.state_dict().get(POWERSGD_KEY)}
        return super().rank_state(model, optimizer)

    def shared_optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        state = dict(optimizer.state_dict())
        state.pop(POWERSGD_KEY, None)  # each rank's error feedback: in its part
        if self.shard_optimizer:
            from ringtrain.sharding import KEY

            state.pop(KEY, None)  # each rank's shard: in its part
        return state

    def wants_every_part(self, own: Mapping[str, Any]) -> bool:
        # sharded, its own shard does at the same size; unsharded, it consolidates every rank's
        return SHARD_KEY in own and not (self.shard_optimizer and self.local_sgd is None)

    def _from_shards(self, shards: list[Any], mine: bool) -> Any:
        # ringtrain's DistributedOptimizer takes the shards as they are: sharded, its own at the same size
        # or every rank's at another; unsharded, every rank's (it consolidates them)
        return shards[0] if mine and self.shard_optimizer else list(shards)

    def _with_rank_state(self, optimizer_state: Any, parts: Sequence[Mapping[str, Any]],
                         mine: bool) -> Any:
        if self.method.name != "powersgd" or not parts or parts[0].get("powersgd") is None:
            return optimizer_state
        from ringtrain.powersgd import merge_powersgd_states

        states = [part["powersgd"] for part in parts]
        return {**optimizer_state, POWERSGD_KEY: states[0] if mine else merge_powersgd_states(states)}

    def refresh(self) -> None:
        """Read rank and size again after an elastic reset (the device stays: local rank is fixed)."""
        self.rank, self.world_size = self._hvd.rank(), self._hvd.size()
        self.local_world_size = self._hvd.local_size()

    def step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is None or self.local_sgd is not None:
            step_optimizer(optimizer, scaler)  # Local SGD: no gradient exchange to wait for first
            return
        # the gradients must be averaged before the scaler looks at them for inf/nan
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        # one name per shape and dtype: the engine's response cache then serves repeats cheaply
        name = f"ringtrain.trainer.sum.{tuple(tensor.shape)}.{tensor.dtype}"
        out = self._hvd.allreduce(tensor.detach().cpu(), name=name, op=self._hvd.Sum)
        return out.cpu()

    def sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        name = f"ringtrain.trainer.sum_async.{tuple(tensor.shape)}.{tensor.dtype}"
        handle = self._hvd.allreduce_async(tensor.detach().cpu(), name=name, op=self._hvd.Sum)
        return lambda: self._hvd.synchronize(handle).cpu()

    def teardown(self, wait_for_peers: bool = True) -> None:
        if self._hvd is not None:
            self._hvd.shutdown()
            self._hvd = None


STRATEGIES: dict[str, type[Strategy]] = {"ddp": DDPStrategy, "horovod": HorovodStrategy}
"""Strategy name -> class."""


def make_strategy(name: str, device: str | None = None, fp16_allreduce: bool = False,
                  batches_per_allreduce: int = 1, elastic: bool = False, compression: str = "none",
                  local_sgd: LocalSGDSettings | None = None, shard_optimizer: bool = False) -> Strategy:
    """A strategy by name, not yet set up (``elastic``: only ``horovod`` can re-form in process)."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"strategy={name!r} is not known. HINT: use one of {sorted(STRATEGIES)}.") from None
    if elastic and cls is not HorovodStrategy:
        raise ValueError(f"strategy={name!r} cannot go on after a worker fails: torch's process groups do "
                         "not re-form in process. HINT: use strategy='horovod' (--strategy horovod) for "
                         "elastic training.")
    return cls(device=device, fp16_allreduce=fp16_allreduce, batches_per_allreduce=batches_per_allreduce,
               elastic=elastic, compression=compression, local_sgd=local_sgd, shard_optimizer=shard_optimizer)
