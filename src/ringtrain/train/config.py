"""``TrainerConfig``: every knob of a training run in one frozen, validated dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ringtrain.exchange import Method, local_sgd, parse_compression

STRATEGIES = ("ddp", "horovod")
TASKS = ("classification", "regression")
SNAPSHOT_MODES = ("background", "sync")


def _positive_int(name: str, value: Any, example: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a whole number of at least 1. HINT: use e.g. "
                         f"{name}={example}.")


def _optional_positive_int(name: str, value: Any, example: int, off: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name}={value!r} must be a whole number of at least 1 or None. HINT: use "
                         f"e.g. {name}={example}, or {name}=None {off}.")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    """How a ``Trainer`` trains: epochs, batching, strategy, precision, snapshots, logging."""

    epochs: int = 1
    """Passes over the training set (the total, counting epochs already done by a resumed snapshot)."""
    batch_size: int = 64
    """Items per micro-batch on each rank; the global batch is this x world size x batches_per_allreduce."""
    strategy: str = "ddp"
    """``"ddp"`` (torch DistributedDataParallel) or ``"horovod"`` (ringtrain's DistributedOptimizer)."""
    fp16_allreduce: bool = False
    """Send gradients as float16 (horovod: ``Compression.fp16``; ddp: the fp16 compress hook); the same as
    ``compression="fp16"``."""
    compression: str = "none"
    """How gradients travel (docs/slow-links.md): ``"none"``, ``"fp16"``, ``"bf16"``, ``"powersgd"`` (rank 4)
    or ``"powersgd:R"`` (horovod: ringtrain's PowerSGD; ddp: torch's PowerSGD hook), or ``"auto"``: chosen
    once at the start from the measured link and the gradients' size, and said in the log."""
    sync_every: int | None = None
    """Local SGD: each rank steps on its own gradients and the ranks average what they learned every this
    many steps (``outer_lr`` / ``outer_momentum`` make it DiLoCo); None: gradients averaged every step."""
    outer_lr: float = 1.0
    """Local SGD's outer learning rate, applied to the averaged parameter delta (1: plain averaging)."""
    outer_momentum: float = 0.0
    """Local SGD's outer (Nesterov) momentum; DiLoCo uses ``outer_lr=0.7, outer_momentum=0.9``."""
    shard_optimizer: bool = False
    """Keep each parameter's optimizer state on one rank only (ZeRO stage 1: about 1/N of it per rank;
    horovod: ``DistributedOptimizer(shard_optimizer_state=True)``, ddp: torch's ZeroRedundancyOptimizer)."""
    batches_per_allreduce: int = 1
    """Micro-batches whose gradients are accumulated locally before one allreduce and optimizer step."""
    amp: bool = False
    """Mixed precision: float16 autocast + GradScaler on CUDA, bfloat16 autocast on CPU."""
    scale_lr: bool = False
    """Multiply the optimizer's learning rate by world size x batches_per_allreduce (Goyal et al.)."""
    warmup_epochs: float = 0.0
    """Ramp the learning rate linearly from its unscaled value to the scaled one over this many epochs."""
    task: str = "classification"
    """``"classification"`` (reports accuracy) or ``"regression"`` (reports RMSE)."""
    seed: int = 0
    """Seeds the shuffling, the RNGs of every rank (offset by rank) and nothing else."""
    save_every: int | None = None
    """Write a snapshot every this many epochs (and after the last one); None: no epoch snapshots."""
    save_every_steps: int | None = None
    """Also write a snapshot every this many optimizer steps; None: only at epoch ends. In elastic mode
    also an in-memory commit (with ``elastic=True`` it may be given without ``snapshot_dir``)."""
    snapshot_dir: str | None = None
    """Folder of the snapshots; the latest complete one there is resumed on start."""
    keep_last: int = 3
    """How many snapshots to keep; older ones are deleted after a new one is committed."""
    snapshot_mode: str = "background"
    """``"background"``: a save blocks training only to copy the state into memory of a writer process,
    which writes it beside training (docs/restarts.md); ``"sync"``: written before training goes on (as
    in elastic mode, which always saves so)."""
    resume: bool = True
    """Resume from the latest snapshot in ``snapshot_dir`` when there is one."""
    eval_every: int = 1
    """Evaluate on the eval data every this many epochs (and after the last one)."""
    threads: int | None = None
    """torch threads per rank on CPU; None: the machine's cores divided by the local ranks, at least 1."""
    num_workers: int = 0
    """DataLoader worker processes per rank."""
    progress: bool = True
    """Show progress on rank 0: a bar on a terminal, else a line every 10 s (pipes, scheduler logs)."""
    log_dir: str | None = None
    """Write ``metrics.csv`` (and TensorBoard events, if installed) here from rank 0."""
    device: str | None = None
    """``"cpu"`` or ``"cuda"``; None: CUDA when available."""
    max_steps_per_epoch: int | None = None
    """Stop each epoch after this many optimizer steps (quick trials); None: the whole epoch."""
    elastic: bool | None = None
    """Go on in process when workers fail or hosts change (Horovod elastic; strategy ``horovod``),
    committing at every epoch end and ``save_every_steps`` point. None: on when started by ringtrain
    run's elastic mode (--min-np/--max-np/--host-discovery-script)."""
    signals_to_handle: str = "SIGTERM,SIGUSR1"
    """Signals that stop training gracefully (comma-separated, torchrun's ``--signals-to-handle``): every
    rank stops after the same step, one snapshot is written, and ``ringtrain train`` exits 75
    (docs/preemption.md). '' handles none."""
    walltime_margin_s: float | None = 120.0
    """Where the scheduler's end time of the job is known (Slurm), stop the same graceful way this many
    seconds before it even if no signal comes; None: do not look."""

    def __post_init__(self) -> None:
        _positive_int("epochs", self.epochs, 3)
        _positive_int("batch_size", self.batch_size, 64)
        _positive_int("batches_per_allreduce", self.batches_per_allreduce, 2)
        _positive_int("keep_last", self.keep_last, 3)
        if self.snapshot_mode not in SNAPSHOT_MODES:
            raise ValueError(f"snapshot_mode={self.snapshot_mode!r} is not known. HINT: use one of "
                             f"{list(SNAPSHOT_MODES)}.")
        _positive_int("eval_every", self.eval_every, 1)
        _optional_positive_int("save_every", self.save_every, 1, "for no epoch snapshots")
        _optional_positive_int("save_every_steps", self.save_every_steps, 100, "for no step snapshots")
        _optional_positive_int("threads", self.threads, 1, "to use cores / local ranks")
        _optional_positive_int("max_steps_per_epoch", self.max_steps_per_epoch, 100, "for whole epochs")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is not known. HINT: use one of {list(STRATEGIES)}.")
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not known. HINT: use one of {list(TASKS)}.")
        workers = self.num_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"num_workers={self.num_workers!r} must be 0 or more. HINT: use num_workers=0 "
                             "to load batches in the training process.")
        if not isinstance(self.warmup_epochs, int | float) or not 0 <= self.warmup_epochs < float("inf"):
            raise ValueError(f"warmup_epochs={self.warmup_epochs!r} must be a finite number >= 0. "
                             "HINT: use e.g. warmup_epochs=5, or 0 for no warm-up.")
        if self.warmup_epochs > 0 and not self.scale_lr:
            raise ValueError(f"warmup_epochs={self.warmup_epochs} has no effect without scale_lr=True: the "
                             "warm-up ramps to the scaled learning rate. HINT: set scale_lr=True, or "
                             "warmup_epochs=0.")
        commits_only = self.elastic and self.save_every_steps and not self.save_every
        if (self.save_every or self.save_every_steps) and not self.snapshot_dir and not commits_only:
            raise ValueError("save_every / save_every_steps is set but snapshot_dir is not, so snapshots "
                             "would have nowhere to go. HINT: pass snapshot_dir='snapshots' (any folder).")
        if self.device not in (None, "cpu", "cuda"):
            raise ValueError(f"device={self.device!r} is not known. HINT: use 'cpu', 'cuda' or None (auto).")
        if self.elastic not in (None, True, False):
            raise ValueError(f"elastic={self.elastic!r} must be True, False or None (auto). HINT: use "
                             "elastic=True.")
        if self.elastic and self.strategy != "horovod":
            raise ValueError(f"elastic=True needs strategy='horovod', not strategy={self.strategy!r}: "
                             "torch's process groups do not re-form in process. HINT: pass "
                             "strategy='horovod' (--strategy horovod).")
        from ringtrain.train.preemption import parse_signals

        if not isinstance(self.signals_to_handle, str):
            raise ValueError(f"signals_to_handle={self.signals_to_handle!r} must be a comma-separated "
                             "string. HINT: use signals_to_handle='SIGTERM,SIGUSR1'.")
        parse_signals(self.signals_to_handle)
        margin = self.walltime_margin_s
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, int | float)
                                   or not 0 <= margin < float("inf")):
            raise ValueError(f"walltime_margin_s={margin!r} must be a number of seconds >= 0 or None. HINT: "
                             "use e.g. walltime_margin_s=120.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a whole number >= 0. HINT: use e.g. seed=0.")
        self._check_exchange()

    def _check_exchange(self) -> None:
        """compression, fp16_allreduce and Local SGD's settings: each valid, and together meaningful."""
        method = parse_compression(self.compression)
        if self.fp16_allreduce and method.name not in ("none", "fp16"):
            raise ValueError(f"fp16_allreduce=True and compression={self.compression!r} both say how "
                             "gradients travel. HINT: drop fp16_allreduce=True, or use compression='fp16'.")
        _optional_positive_int("sync_every", self.sync_every, 8, "to average gradients every step")
        for name, low, high in (("outer_lr", 0.0, float("inf")), ("outer_momentum", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    low < value < high if name == "outer_lr" else low <= value < high):
                bound = "a finite number > 0" if name == "outer_lr" else "a number from 0 up to (not incl.) 1"
                raise ValueError(f"{name}={value!r} must be {bound}. HINT: use e.g. {name}="
                                 f"{0.7 if name == 'outer_lr' else 0.9} (DiLoCo), or leave it out.")
        if self.sync_every is None and (self.outer_lr != 1.0 or self.outer_momentum != 0.0):
            raise ValueError(f"outer_lr={self.outer_lr} / outer_momentum={self.outer_momentum} apply only to "
                             "Local SGD's averaging. HINT: set e.g. sync_every=8, or leave them out.")
        if not isinstance(self.shard_optimizer, bool):
            raise ValueError(f"shard_optimizer={self.shard_optimizer!r} must be True or False. HINT: use "
                             "shard_optimizer=True.")
        if self.shard_optimizer and self.sync_every is not None:
            raise ValueError(f"shard_optimizer=True with sync_every={self.sync_every}: under Local SGD every "
                             "rank steps all of its parameters on its own, so every rank needs the whole "
                             "optimizer state. HINT: use one of them.")
        if self.sync_every is not None and method.name in ("powersgd", "auto"):
            raise ValueError(f"sync_every={self.sync_every} with compression={self.compression!r}: Local SGD "
                             "averages parameters every few steps instead of gradients every step, so there "
                             "are no gradients for PowerSGD to compress or for 'auto' to choose for. HINT: "
                             f"use one of them; with sync_every={self.sync_every}, compression='fp16' or "
                             "compression='bf16' casts the averaged deltas.")

    def exchange_method(self) -> Method:
        """The :class:`ringtrain.exchange.Method` these settings ask for (``auto`` still undecided)."""
        if self.sync_every is not None:
            return local_sgd(self.sync_every)
        method = parse_compression(self.compression)
        if self.fp16_allreduce and method.name == "none":
            return parse_compression("fp16")
        return method

    def wire_compression(self) -> str:
        """What travels per element: ``none``, ``fp16`` or ``bf16`` (Local SGD's deltas cast the same way)."""
        name = parse_compression(self.compression).name
        if self.fp16_allreduce:
            return "fp16"
        return name if name in ("fp16", "bf16") else "none"

    def replace(self, **changes: Any) -> TrainerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (for snapshots, logs and the worker spec)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
