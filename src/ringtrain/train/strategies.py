"""How gradients meet: torch DistributedDataParallel, or ringtrain's Horovod DistributedOptimizer.

A strategy owns the process group it starts, the device of this rank, and the few operations the
Trainer needs from it: wrap the model and optimizer, skip gradient sync on accumulating passes, take
an optimizer step (with or without a GradScaler), sum a tensor over ranks.
"""

from __future__ import annotations

import contextlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtrain.env import detect_environment
from ringtrain.train.logs import LOGGER_NAME


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
                 batches_per_allreduce: int = 1, elastic: bool = False) -> None:
        self.requested_device = device
        #: The Trainer runs inside ``hvd.elastic.run``: the first sync spreads rank 0's state instead of
        #: ``prepare`` (a worker joining a running group must not call collectives the others don't).
        self.elastic = elastic
        self.fp16_allreduce = fp16_allreduce
        self.batches_per_allreduce = batches_per_allreduce
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
        if self.world_size == 1:
            return model, optimizer
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=self.group)
        if self.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            wrapped.register_comm_hook(self.group, default_hooks.fp16_compress_hook)
        return wrapped, optimizer

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

        compression = Compression.fp16 if self.fp16_allreduce else Compression.none
        wrapped = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                       compression=compression,
                                       backward_passes_per_step=self.batches_per_allreduce)
        if not self.elastic:
            broadcast_parameters(model.state_dict(), root_rank=0)
            broadcast_optimizer_state(wrapped, root_rank=0)
        return model, wrapped

    def refresh(self) -> None:
        """Read rank and size again after an elastic reset (the device stays: local rank is fixed)."""
        self.rank, self.world_size = self._hvd.rank(), self._hvd.size()
        self.local_world_size = self._hvd.local_size()

    def step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is None:
            optimizer.step()
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
                  batches_per_allreduce: int = 1, elastic: bool = False) -> Strategy:
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
               elastic=elastic)
