"""``Trainer``: the data-parallel training loop, readable top to bottom.

``Trainer(model, optimizer, loss_fn, train_data, eval_data, config).train()`` joins the job (DDP or
Horovod strategy), shards the data, resumes the latest snapshot, trains and evaluates every epoch,
and returns one ``EpochResult`` per epoch, identical on every rank. In elastic mode (Horovod
strategy, started by ``ringtrain run --min-np/--max-np``) the epochs run inside ``hvd.elastic.run``
and a failed worker costs the work since the last commit, not the job (:mod:`ringtrain.train.elastic`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ringtrain.engine import elastic_rendezvous
from ringtrain.engine.settings import read_knob
from ringtrain.env.allocator import tune_allocator
from ringtrain.env.binding import bind_rank
from ringtrain.env.cores import usable_cores
from ringtrain.env.walltime import allocation_end
from ringtrain.exchange import local_sgd, wire_cost
from ringtrain.train import background_snapshots, resuming, rng
from ringtrain.train.agreement import agreed, check_all
from ringtrain.train.background_snapshots import SnapshotTiming, TrainerSnapshots, wait_for_writers
from ringtrain.train.config import TrainerConfig
from ringtrain.train.data import ShardedLoader, as_arguments, to_device
from ringtrain.train.logs import MetricsLog, RankZero, init_logger
from ringtrain.train.metrics import EpochResult, MetricTotals, real_items_in_batch
from ringtrain.train.preemption import Preempted, StopAgreement, StopSignals, parse_signals, signal_name
from ringtrain.train.progress import Progress
from ringtrain.train.schedules import scale_learning_rate, warmup_scheduler
from ringtrain.train.snapshots import (
    SnapshotError,
    SnapshotManager,
    model_fingerprint,
    part_name,
    snapshot_name,
)
from ringtrain.train.strategies import HorovodStrategy, LocalSGDSettings, Strategy, make_strategy

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class Trainer:
    """Trains ``model`` data-parallel over all ranks of the job this process belongs to.

    ``train_data`` / ``eval_data`` are datasets (items ``(features, target)``, features a tensor or a
    tuple of tensors for ``model(*features)``) or DataLoaders (their dataset, batch size and collate
    function are kept; the Trainer adds its own distributed sampler). ``scheduler`` is an optional
    ``optimizer -> LR scheduler`` factory, stepped after every optimizer step; it is called with the
    optimizer the strategy returns (Horovod wraps it), so it must not be built beforehand.
    ``on_step`` is called with the Trainer after every optimizer step (``ringtrain bench`` times steps
    with it); it runs on every rank and must not call collectives that other ranks do not call.
    ``strategy``, when given, is a :class:`Strategy` object (not yet set up) to use instead of the one
    ``config.strategy`` names (``ringtrain bench`` measures its ``barrier`` reference with it).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[..., torch.Tensor], train_data: Any, eval_data: Any = None,
                 config: TrainerConfig | None = None, scheduler: SchedulerFactory | None = None,
                 on_step: Callable[[Trainer], None] | None = None, strategy: Strategy | None = None) -> None:
        self.config = config = config or TrainerConfig()
        self.on_step = on_step
        if scheduler is not None and config.scale_lr and config.warmup_epochs > 0:
            raise ValueError("both a scheduler and warmup_epochs were given; only one can drive the learning "
                             "rate. HINT: drop warmup_epochs, or fold the warm-up into your scheduler.")
        init_logger()
        # Before any tensor is allocated; every strategy (the single baseline too) runs with the same malloc.
        tune_allocator(read_knob("malloc"))
        bind_rank(read_knob("bind"))
        #: Elastic mode: asked for, or (by default) when started by ringtrain run's elastic driver.
        self.elastic = config.elastic if config.elastic is not None else elastic_rendezvous.enabled()
        if strategy is None:
            local = (LocalSGDSettings(config.sync_every, config.outer_lr, config.outer_momentum)
                     if config.sync_every is not None else None)
            strategy = make_strategy(config.strategy, config.device, config.fp16_allreduce,
                                     config.batches_per_allreduce, elastic=self.elastic,
                                     compression=config.compression, local_sgd=local,
                                     shard_optimizer=config.shard_optimizer)
        self.strategy: Strategy = strategy
        self.strategy.setup()
        s = self.strategy
        self.out = RankZero(s.rank)
        if s.device.type == "cpu":
            torch.set_num_threads(config.threads or max(1, usable_cores() // max(1, s.local_world_size)))
        rng.seed_everything(config.seed + s.rank)

        self.model = model.to(s.device)
        self.loss_fn = loss_fn
        self.fingerprint = model_fingerprint(model)
        self._data = (train_data, eval_data)
        self._shard()

        #: The optimizer as the caller configured it (before scaling and schedules): a snapshot records it,
        #: and a resumed run that configures it otherwise applies its own values (see ``resume``).
        self._optimizer_class = type(optimizer).__name__
        self._hyperparameters = resuming.hyperparameters(optimizer.param_groups)
        self.lr_factor = float(s.world_size * config.batches_per_allreduce) if config.scale_lr else 1.0
        self._lr_world = s.world_size
        """The world size the optimizer's learning rate is scaled for."""
        if self.lr_factor != 1.0:
            scale_learning_rate(optimizer, self.lr_factor)
        decided = s.decide(self.model)  # --compression auto: from the measured link (collective)
        if decided:
            self.out.print(f"ringtrain train: {decided}")
        self.train_model, self.optimizer = s.prepare(self.model, optimizer)
        self.scheduler = None
        self._warmup: tuple[float, int] | None = None
        """The warm-up's factor and steps, when the scheduler is the Trainer's own warm-up."""
        if scheduler is not None:
            self.scheduler = scheduler(self.optimizer)
        elif config.warmup_epochs > 0 and self.lr_factor != 1.0:
            warmup_steps = int(round(config.warmup_epochs * self.steps_per_epoch()))
            self.scheduler = warmup_scheduler(self.optimizer, self.lr_factor, warmup_steps)
            self._warmup = (self.lr_factor, warmup_steps)
        use_scaler = config.amp and s.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None

        self.snapshots = (SnapshotManager(config.snapshot_dir, config.keep_last) if config.snapshot_dir
                          else None)
        self.snapshot_saves: list[SnapshotTiming] = []
        """What each snapshot of this run cost: the training thread's block and the write (rank 0's line)."""
        self._writes = (TrainerSnapshots(self.snapshots, s.rank, self.snapshot_saves, self._say)
                        if self.snapshots is not None and self._writes_in_background() else None)
        if self._writes is not None and (config.save_every or config.save_every_steps) and (
                s.rank == 0 or s.rank_state(self.train_model, self.optimizer) is not None):
            self._writes.start_writer()  # a rank that will write: the writer imports torch meanwhile
        self._part_token = 0
        if self.snapshots is not None and (config.save_every or config.save_every_steps) \
                and not self._joins_running_group():
            # (collective: a worker joining a running elastic group must not wait for the others in it)
            self._check_snapshot_folder()
        self.metrics_log = MetricsLog(config.log_dir) if config.log_dir and s.rank == 0 else None
        self.epoch = 0
        """Epochs completed."""
        self.step = 0
        """Optimizer steps taken in the whole run."""
        self.batch_in_epoch = 0
        """Micro-batches of the current epoch already trained (non-zero only when resumed mid-epoch)."""
        self.history: list[EpochResult] = []
        self._epoch_totals = MetricTotals()
        """This rank's training totals of the current epoch (restored with a mid-epoch snapshot)."""
        self.resumed_from: Path | None = None
        self.resume_notes: list[str] = []
        """What resuming said: the settings applied that differ from the snapshot's run, a finished run."""
        self._elastic_state: Any = None
        """The ``TrainerState`` that commits, in elastic mode while training."""
        self._last_snapshot: tuple[int, Path] | None = None
        self._stopping = self._handle_stop_signals()
        self._stop_signal = 0
        """The agreed signal when it came at an epoch's last step: the Trainer stops after the epoch."""

    def _shard(self) -> None:
        """This rank's loaders for the current world (again after an elastic reset)."""
        c, s = self.config, self.strategy
        train_data, eval_data = self._data
        self.train_loader = ShardedLoader(train_data, c.batch_size, s.world_size, s.rank, shuffle=True,
                                          seed=c.seed, num_workers=c.num_workers,
                                          pin_memory=s.device.type == "cuda")
        self.eval_loader = None if eval_data is None else ShardedLoader(
            eval_data, c.batch_size, s.world_size, s.rank, shuffle=False, seed=c.seed,
            num_workers=c.num_workers, pin_memory=s.device.type == "cuda")
    # --- sizes ------------------------------------------------------------------------------

    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch on every rank."""
        steps = -(-self.train_loader.batches_per_epoch() // self.config.batches_per_allreduce)
        if self.config.max_steps_per_epoch:
            steps = min(steps, self.config.max_steps_per_epoch)
        return steps

    def describe(self) -> str:
        """The derived quantities, printed before the first step."""
        c, s = self.config, self.strategy
        global_batch = c.batch_size * s.world_size * c.batches_per_allreduce
        lrs = ", ".join(f"{g['lr']:.3g}" for g in self.optimizer.param_groups)
        return (f"ringtrain train: {s.world_size} rank(s), strategy {s.name}, device {s.device.type}, "
                f"threads/rank {torch.get_num_threads() if s.device.type == 'cpu' else '-'}, "
                f"global batch {global_batch} ({c.batch_size} x {s.world_size} ranks x "
                f"{c.batches_per_allreduce} accumulated), {self.steps_per_epoch()} steps/epoch, lr {lrs}"
                f"{' (scaled)' if self.lr_factor != 1.0 else ''}, "
                f"train items {self.train_loader.dataset_size}"
                + (f", eval items {self.eval_loader.dataset_size}" if self.eval_loader else "")
                + self._describe_exchange() + self._describe_sharding())

    def _describe_sharding(self) -> str:
        note = self.strategy.sharding_note
        return f"; {note}" if note else ""

    def _describe_exchange(self) -> str:
        """``; gradients: powersgd:4: 0.62 MB a step, 72.1x fewer bytes than fp32 (...)``; fp32: nothing."""
        s = self.strategy
        method = local_sgd(s.local_sgd.sync_every) if s.local_sgd is not None else s.method
        if method.name == "none" or s.world_size == 1:
            return ""
        shapes = [tuple(p.shape) for p in self.model.parameters() if p.requires_grad]
        text = f"; gradients: {wire_cost(shapes, method).describe()}"
        if s.local_sgd is not None:
            c = self.config
            text += (f", outer lr {c.outer_lr:g}" + (f", Nesterov momentum {c.outer_momentum:g}"
                                                     if c.outer_momentum else ""))
        return text

    # --- the run ----------------------------------------------------------------------------

    def train(self) -> list[EpochResult]:
        """Resume if a snapshot exists, then train the remaining epochs; returns this run's epochs."""
        c = self.config
        if not self._joins_running_group():
            # A worker that joins a running elastic group gets its state from rank 0's commit instead
            # (resuming is collective: the running workers would not take part).
            self.resume()
        self.out.print(self.describe())
        if self.resumed_from is not None:
            self.out.print(f"resumed from {self.resumed_from} (epoch {self.epoch + 1}, batch "
                           f"{self.batch_in_epoch}, step {self.step})")
            for note in self.resume_notes:
                self.out.print(note)
        if self.elastic:
            return self._train_elastic()
        while self.epoch < c.epochs:
            self._record(self._run_epoch(self.epoch))
            if self._stop_signal and self.epoch < c.epochs:
                self._preempt(self._stop_signal)
        if self._stopping is not None:
            self._stopping.drain()
        self._finish_snapshots()  # the last snapshot is on disk (or every rank raises) before train returns
        return self.history

    # --- graceful stop on a signal (ringtrain.train.preemption) -----------------------------

    def _handle_stop_signals(self) -> StopAgreement | None:
        """Note the handled signals from now on; the ranks agree on them after every step (not in elastic
        mode, whose commits and driver handle stops)."""
        signals = parse_signals(self.config.signals_to_handle)
        margin = self.config.walltime_margin_s
        end = allocation_end(os.environ) if margin is not None else None
        if not signals and end is None or self.elastic:
            return None
        deadline = None if end is None or margin is None else end - margin
        return StopAgreement(self.strategy.sum_async, StopSignals(signals, deadline).install(),
                             rank=self.strategy.rank)

    def _poll_stop(self, total_batches: int) -> None:
        """After every optimizer step, on every rank: stop here when the ranks agree a signal came."""
        if self._stopping is None or self._stop_signal:
            return
        agreed = self._stopping.poll()
        if agreed:
            if self.batch_in_epoch < total_batches:
                self._preempt(agreed)
            self._stop_signal = agreed  # the epoch's last step: finish the epoch (evaluation, its snapshot)

    def _preempt(self, agreed: int) -> None:
        """Write the step-exact snapshot (unless this step's is written) and raise :class:`Preempted`."""
        assert self._stopping is not None
        stops = self._stopping.signals
        name = signal_name(agreed, stops.received, stops.past_deadline())
        path = None
        if self.snapshots is not None:
            done = self._last_snapshot
            path = done[1] if done and done[0] == self.step else self.save_snapshot()
            self._finish_snapshots()  # on disk before the process exits
        else:
            self.out.warn(f"stopping for {name} without a snapshot folder: nothing to resume from. HINT: "
                          "give --snapshot-dir (TrainerConfig.snapshot_dir).")
        raise Preempted(self.step, path, name)

    def _joins_running_group(self) -> bool:
        """An elastic worker started for a later generation: the running workers are past setup, so it
        takes part in none of the setup's collectives (rank 0's commit brings it up to date)."""
        return self.elastic and os.environ.get(elastic_rendezvous.ENV_GENERATION, "1") != "1"

    def _train_elastic(self) -> list[EpochResult]:
        from ringtrain import elastic
        from ringtrain.train.elastic import TrainerState

        self._elastic_state = state = TrainerState(self)

        @elastic.run
        def epochs(state: TrainerState) -> list[EpochResult]:
            while self.epoch < self.config.epochs:
                self._record(self._run_epoch(self.epoch))
                state.commit()
            return self.history

        try:
            return epochs(state)
        finally:
            self._elastic_state = None

    def _record(self, result: EpochResult) -> None:
        self.history.append(result)
        with self._agreed(f"writing the metrics of epoch {result.epoch}"):
            self.out.print(result.summary(self.config.epochs, self.config.task))
            if self.metrics_log is not None:
                self.metrics_log.write(result.as_row())

    # --- elastic resets ---------------------------------------------------------------------

    def after_reset(self) -> None:
        """The elastic group re-formed: take the new rank and size, re-shard, rescale the learning rate."""
        s = self.strategy
        assert isinstance(s, HorovodStrategy), "elastic mode always runs the Horovod strategy"
        s.refresh()
        self.out = RankZero(s.rank)
        self._shard()
        self.match_learning_rate(self._lr_world)
        self.out.print(f"ringtrain train: the group re-formed with {s.world_size} rank(s); going on from "
                       f"epoch {self.epoch + 1}, batch {self.batch_in_epoch}, step {self.step}")

    def match_learning_rate(self, scaled_for: int) -> None:
        """The learning rate is scaled for ``scaled_for`` workers: scale it for the current number."""
        c, world = self.config, self.strategy.world_size
        if c.scale_lr and scaled_for != world:
            ratio = world / scaled_for
            scale_learning_rate(self.optimizer, ratio)
            if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
                self.scheduler.base_lrs = [lr * ratio for lr in self.scheduler.base_lrs]
            self.lr_factor = float(world * c.batches_per_allreduce)
        self._lr_world = world

    def close(self, failed: bool = False) -> None:
        """Close the logs and leave the job (destroys only a process group the Trainer started).

        ``failed``: leaving because of an exception, which the other ranks may not share (they may be
        inside a collective of the step): leave without waiting for them.
        """
        if self.metrics_log is not None:
            self.metrics_log.close()
        if self._stopping is not None:
            self._stopping.signals.uninstall()
        unsaved = None
        if self._writes is not None:
            if failed:
                self._writes.cancel()  # the other ranks may not hand their parts over: wait for none
            else:
                unsaved = self._writes.settle()  # a snapshot handed over is on disk before the rank leaves
        # a DDP wrapper outliving its process group hangs in gloo's destructor: drop it first
        self.train_model = self.strategy.unwrap(self.train_model)
        gc.collect()
        self.strategy.teardown(wait_for_peers=not failed)
        if unsaved is not None:
            if sys.exc_info()[0] is not None:  # leaving on another exception (a finally): that one goes on
                self.out.warn(str(unsaved))
            else:
                raise unsaved

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    def _agreed(self, what: str) -> Any:
        """``with self._agreed("doing X"):`` local work, then every rank raises if it failed on any."""
        s = self.strategy
        return agreed(s.sum, s.rank, s.world_size, what)

    def _run_epoch(self, epoch: int) -> EpochResult:
        c = self.config
        start = time.perf_counter()
        done_before = self._epoch_totals.count  # items trained in this epoch before a resume
        totals = self._train_batches(epoch)
        self.strategy.end_epoch(self.optimizer)  # Local SGD: the ranks average before evaluating
        train = totals.reduce(self.strategy.sum)
        trained_now = train.count - self.strategy.sum(torch.tensor([done_before], dtype=torch.float64)).item()
        self._epoch_totals = MetricTotals()
        seconds = time.perf_counter() - start
        last = epoch + 1 == c.epochs
        self.epoch, self.batch_in_epoch = epoch + 1, 0
        evaluation = None
        if self.eval_loader is not None and (last or (epoch + 1) % c.eval_every == 0):
            evaluation = self.evaluate()
        snapshot = None
        if self.snapshots and c.save_every and (last or (epoch + 1) % c.save_every == 0):
            snapshot = self.save_snapshot()
        result = EpochResult(
            epoch=epoch + 1, seconds=seconds, train_loss=train.loss,
            samples_per_second=trained_now / seconds if seconds > 0 else float("nan"), steps=self.step,
            eval_loss=evaluation.loss if evaluation else float("nan"),
            accuracy=evaluation.accuracy if evaluation and c.task == "classification" else float("nan"),
            rmse=evaluation.rmse if evaluation and c.task == "regression" else float("nan"),
            eval_items=int(evaluation.count) if evaluation else 0,
            snapshot=str(snapshot) if snapshot else None)
        return result

    def _train_batches(self, epoch: int) -> MetricTotals:
        c, s = self.config, self.strategy
        loader = self.train_loader
        total_batches = loader.batches_per_epoch()
        if c.max_steps_per_epoch:
            total_batches = min(total_batches, c.max_steps_per_epoch * c.batches_per_allreduce)
        k = c.batches_per_allreduce
        totals = self._epoch_totals
        self.train_model.train()
        bar = Progress(c.progress and s.rank == 0, total_batches, f"epoch {epoch + 1}/{c.epochs}",
                       initial=self.batch_in_epoch)
        try:
            for b, (features, targets) in enumerate(loader.epoch(epoch, self.batch_in_epoch),
                                                    start=self.batch_in_epoch):
                if b >= total_batches:
                    break
                group_start = b - b % k
                group_size = min(k, total_batches - group_start)
                last_of_group = b + 1 == group_start + group_size
                features, targets = to_device(features, s.device), to_device(targets, s.device)
                with s.accumulating(self.train_model, sync=last_of_group), self._autocast():
                    outputs = self.train_model(*as_arguments(features))
                    loss = self.loss_fn(outputs, targets)
                scaled = loss / group_size
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                real = real_items_in_batch(loader.dataset_size, s.world_size, s.rank, loader.batch_size, b)
                if real == len(targets):
                    totals.add(loss, outputs, targets, c.task)
                else:  # the sampler's padding items train but do not count in the metrics
                    with torch.no_grad():
                        totals.add(self.loss_fn(outputs[:real].float(), targets[:real]), outputs[:real],
                                   targets[:real], c.task)
                if last_of_group:
                    s.step(self.optimizer, self.scaler)
                    self.optimizer.zero_grad(set_to_none=True)
                    if self.scheduler is not None:
                        self.scheduler.step()
                    self.step += 1
                    self.batch_in_epoch = b + 1
                    if self.on_step is not None:
                        self.on_step(self)
                    if (c.save_every_steps and self.step % c.save_every_steps == 0
                            and self.batch_in_epoch < total_batches):
                        if self.snapshots:
                            self.save_snapshot()
                        if self._elastic_state is not None:
                            self._elastic_state.commit()
                    self._poll_stop(total_batches)
                bar.update(1, loss=loss.detach())  # read (a device sync) only when a bar shows it
        finally:
            bar.close()
        return totals

    def _autocast(self) -> Any:
        if not self.config.amp:
            return nullcontext()
        device = self.strategy.device.type
        dtype = torch.float16 if device == "cuda" else torch.bfloat16
        return torch.autocast(device_type=device, dtype=dtype)

    @torch.no_grad()
    def evaluate(self) -> MetricTotals:
        """Loss and accuracy (or RMSE) on the eval data, summed over ranks by item count."""
        if self.eval_loader is None:
            raise ValueError("evaluate() needs eval_data. HINT: pass eval_data=... to Trainer.")
        c, s = self.config, self.strategy
        model = s.unwrap(self.train_model)
        was_training = model.training
        model.eval()
        loader = self.eval_loader
        totals = MetricTotals()
        try:
            with self._agreed("evaluating"):
                for b, (features, targets) in enumerate(loader.epoch(0)):
                    features, targets = to_device(features, s.device), to_device(targets, s.device)
                    real = real_items_in_batch(loader.dataset_size, s.world_size, s.rank, loader.batch_size,
                                               b)
                    with self._autocast():
                        outputs = model(*as_arguments(features))
                    outputs, targets = outputs[:real].float(), targets[:real]
                    totals.add(self.loss_fn(outputs, targets), outputs, targets, c.task)
                totals.flush()
        finally:
            model.train(was_training)
        return totals.reduce(s.sum)

    # --- snapshots --------------------------------------------------------------------------

    def _gather_rows(self, row: torch.Tensor) -> torch.Tensor:
        """Every rank's ``row`` stacked in rank order (a sum of zero-padded rows: any strategy can do it)."""
        s = self.strategy
        table = torch.zeros((s.world_size, row.numel()), dtype=row.dtype)
        table[s.rank] = row.reshape(-1)
        return s.sum(table)

    def state(self, shared: bool = True) -> dict[str, Any]:
        """What a snapshot holds (collective: every rank must call it). ``shared``: without what differs
        from rank to rank (that goes into the ranks' parts); an elastic commit, which each rank keeps of
        its own, holds all of it."""
        t = self._epoch_totals.flush()
        states = rng.capture()
        return {
            "model": self.strategy.unwrap(self.train_model).state_dict(),
            "optimizer": (self.strategy.shared_optimizer_state(self.optimizer) if shared
                          else self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": self.epoch,
            "step": self.step,
            "batch_in_epoch": self.batch_in_epoch,
            "epoch_totals": self._gather_rows(torch.tensor(
                [t.loss_sum, t.correct, t.squared_error, t.count], dtype=torch.float64)),
            "world_size": self.strategy.world_size,
            "batch_size": self.train_loader.batch_size,
            "rng": {key: self._gather_rows(value) for key, value in states.items()},
            "fingerprint": self.fingerprint,
            "config": {k: v for k, v in self.config.as_dict().items()
                       if k not in ("snapshot_dir", "snapshot_mode")},  # where and how, not what
            "run": {"optimizer": self._optimizer_class, "hyperparameters": self._hyperparameters,
                    "lr_factor": self.lr_factor, "train_items": self.train_loader.dataset_size},
        }

    def save_snapshot(self) -> Path | None:
        """Take a snapshot (collective); returns its path on every rank.

        In the background (``snapshot_mode="background"``, the default): each rank waits for its previous
        write, copies its share (rank 0: the state; every rank: its part, where it has one) into memory
        its writer process holds and goes on; the writers write it beside training and rank 0's commits
        it once every part is durable (docs/restarts.md). A write that failed makes every rank raise here,
        at the next save, or at the end of training. Synchronously (``snapshot_mode="sync"``, elastic
        mode): written before any rank goes on.
        """
        if self.snapshots is None:
            raise ValueError("save_snapshot() needs a snapshot folder. HINT: set snapshot_dir in "
                             "TrainerConfig.")
        if self._writes is None:
            return self._save_snapshot_now()
        started = time.perf_counter()
        s = self.strategy
        self._finish_snapshots()  # never two writes in flight; a failed one stops every rank here
        state = self.state()
        part = s.rank_state(self.train_model, self.optimizer)  # present on every rank, or on none
        token = self._snapshot_token() if part is not None else 0
        handle = self._writes.submit(self.step, state if s.rank == 0 else None, part, s.world_size, token)
        handle.blocked_s = time.perf_counter() - started
        path = self.snapshots.folder / snapshot_name(self.step)
        self._last_snapshot = (self.step, path)
        return path

    def _writes_in_background(self) -> bool:
        return (self.config.snapshot_mode == "background" and not self.elastic
                and background_snapshots.supported())

    def _say(self, line: str) -> None:
        self.out.print(line)

    def _agree_on_snapshots(self, failure: BaseException | None) -> None:
        """Every rank raises when a write failed on any rank (collective); the writes in flight then wait
        for no other rank."""
        s = self.strategy
        try:
            check_all(s.sum, s.rank, s.world_size, "writing a snapshot", failure)
        except BaseException:
            if self._writes is not None:
                self._writes.cancel()
            raise

    def _finish_snapshots(self) -> None:
        """Wait for the write in flight; every rank raises if it failed on any (collective)."""
        if self._writes is not None:
            self._agree_on_snapshots(self._writes.settle())

    def _snapshot_token(self) -> int:
        """A number of this run that every rank shares, naming the ranks' part records (collective, once)."""
        if not self._part_token:
            mine = float(int.from_bytes(os.urandom(6), "big") | 1) if self.strategy.rank == 0 else 0.0
            self._part_token = int(self.strategy.sum(torch.tensor([mine], dtype=torch.float64)).item())
        return self._part_token

    def _save_snapshot_now(self) -> Path | None:
        """The synchronous save: every rank's part, then rank 0's snapshot, before any rank goes on."""
        assert self.snapshots is not None
        started = time.perf_counter()
        state = self.state()
        path = self.snapshots.folder / f"snapshot-{self.step:09d}.pt"
        s = self.strategy
        part = s.rank_state(self.train_model, self.optimizer)  # present on every rank, or on none
        records = None
        if part is not None:
            record: dict[str, Any] = {}
            with self._agreed("writing this rank's part of a snapshot"):
                record = self.snapshots.save_part(part, self.step, s.rank)
            records = self._gather_part_records(record)
        # nobody runs ahead of a snapshot that is not on disk yet, nor waits for one that failed
        with self._agreed("writing a snapshot"):
            if s.rank == 0:
                path = self.snapshots.save(state, self.step, parts=records)
        self._last_snapshot = (self.step, path)
        took = time.perf_counter() - started
        size = 0
        if s.rank == 0 and path is not None:
            with contextlib.suppress(OSError):  # pruned at once when the folder holds newer snapshots
                size = path.stat().st_size
        timing = SnapshotTiming(self.step, str(path), "sync", took, took, size)
        self.snapshot_saves.append(timing)
        self._say(timing.line())
        return path

    def _gather_part_records(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's part record (its file, size and SHA-256), in rank order (collective)."""
        digest = bytes.fromhex(record["sha256"])
        row = torch.tensor([float(record["bytes"]), *digest], dtype=torch.float64)  # exact up to 2**53
        table = self._gather_rows(row)
        return [{"file": part_name(self.step, rank), "bytes": int(values[0]),
                 "sha256": bytes(int(v) for v in values[1:]).hex()}
                for rank, values in enumerate(table.tolist())]

    def _check_snapshot_folder(self) -> None:
        """Rank 0 checks that the snapshot folder takes files, before the first step; every rank raises
        the same :class:`SnapshotError` if it does not (collective)."""
        assert self.snapshots is not None
        problem = None
        if self.strategy.rank == 0:
            try:
                self.snapshots.check_writable()
            except SnapshotError as exc:
                problem = str(exc)
        if self.strategy.sum(torch.tensor([1.0 if problem else 0.0])).item():
            raise SnapshotError(problem or f"rank 0 cannot write snapshots to {self.snapshots.folder} (see "
                                           "its error). HINT: point --snapshot-dir at a folder rank 0 can "
                                           "write.")

    def resume(self) -> Path | None:
        """Load the newest good snapshot, if resuming is on and there is one; returns its path.

        A damaged snapshot (checksum mismatch, truncated) is reported and skipped for the next older
        one; the ranks check that they all resume the same one.
        """
        if self.snapshots is None or not self.config.resume:
            attempt = os.environ.get("RINGTRAIN_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            if attempt not in ("", "0"):
                why = "resume=False" if self.snapshots else "no snapshot_dir"
                self.out.warn(f"this is restart attempt {attempt} of the job, but it cannot resume ({why}): "
                              "training starts afresh.")
            return None
        # the listing happens after the clean-up, on every rank; the clean-up after the writers of ranks
        # that died (a restart) have finished the snapshots they were handed
        with self._agreed(f"cleaning up {self.snapshots.folder}"):
            if self.strategy.rank == 0:
                for note in wait_for_writers(self.snapshots.folder):
                    self.out.warn(note)
                self.snapshots.remove_stale_temporaries()
        path = body = None
        skipped: list[str] = []
        with self._agreed(f"loading a snapshot from {self.snapshots.folder}"):
            path, body, skipped = self.snapshots.load_newest(self.fingerprint)
        for why in skipped:
            self.out.warn(f"{why}: skipped, resuming from an older snapshot")
        step = -1 if path is None else int(path.stem.split("-")[1])
        agreed = self.strategy.sum(torch.tensor([float(step), 1.0], dtype=torch.float64))
        if agreed[0].item() != step * agreed[1].item():
            raise SnapshotError(f"the ranks found different snapshots to resume in {self.snapshots.folder} "
                                f"(this rank: {path}). HINT: give every rank the same --snapshot-dir on a "
                                "shared file system.")
        if path is None or body is None:
            return None
        problem = resuming.refusal(path, body, self.config.seed, self._optimizer_class)
        if problem:  # the same snapshot and flags on every rank: each refuses alike
            raise SnapshotError(problem)
        with self._agreed(f"loading {path}"):
            parts = self._own_parts(path, body)
            # this rank's own part alone, or every rank's (another world, or shards to consolidate)
            same_world = int(body.get("world_size", -1)) == self.strategy.world_size
            self.load_state(body, path, parts, mine=same_world and len(parts) <= 1)
        changed = resuming.config_changes(body, self.config.as_dict(), self.strategy.world_size,
                                          self.train_loader.dataset_size)
        changed += self._apply_hyperparameters(body)
        self.resume_notes = []
        if changed:
            self.resume_notes.append("changed since the snapshot, applied: " + ", ".join(changed))
        if resuming.finished(body, self.config.epochs):
            self.resume_notes.append(resuming.finished_message(path, body, self.config.epochs))
        self.resumed_from = path
        return path

    def _apply_hyperparameters(self, body: dict[str, Any]) -> list[str]:
        """Give the optimizer this run's configured hyperparameters where they differ from the snapshot's
        run (its state was just loaded with the old ones); returns a note for each difference.

        The learning rate is compared as the run's base rate (configured x ``scale_lr``'s factor), and a
        difference multiplies the current rate and the scheduler's base rates by new / old, so that a
        schedule goes on where it was, from the new rate.
        """
        run = body.get("run") or {}
        config = body.get("config") or {}
        old_groups = run.get("hyperparameters")
        old_factor = (float(run.get("lr_factor", 0.0))
                      or resuming.scaled_lr_factor(config, int(body.get("world_size", 1))))
        if old_groups is None:
            # A snapshot of an earlier version records no configured values: its optimizer's settings are
            # the configured ones (times the factor) unless a scheduler was changing them.
            if body.get("scheduler") is not None:
                self._restore_warmup()
                return []
            old_groups = [{**group, "lr": group["lr"] / old_factor} if "lr" in group else group
                          for group in resuming.hyperparameters(body["optimizer"]["param_groups"])]
        notes: list[str] = []
        ratios = []
        for index, (new, old) in enumerate(zip(self._hyperparameters, old_groups)):
            group = self.optimizer.param_groups[index]
            which = f" (group {index})" if len(self._hyperparameters) > 1 else ""
            ratio = 1.0
            if "lr" in new and "lr" in old:
                if not resuming.same(new["lr"], old["lr"]):
                    notes.append(resuming.change("lr", old["lr"], new["lr"], which))
                before, after = old["lr"] * old_factor, new["lr"] * self.lr_factor
                if not resuming.same(before, after) and before > 0:
                    ratio = after / before
                    group["lr"] *= ratio
                    if "initial_lr" in group:
                        group["initial_lr"] *= ratio
            ratios.append(ratio)
            for key, value in new.items():
                if key != "lr" and key in old and not resuming.same(value, old[key]):
                    notes.append(resuming.change(key, old[key], value, which))
                    group[key] = value
        if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
            self.scheduler.base_lrs = [lr * ratio for lr, ratio in zip(self.scheduler.base_lrs, ratios)]
        self._restore_warmup()
        return notes

    def _restore_warmup(self) -> None:
        """The Trainer's own warm-up takes this run's factor and length again (loading the scheduler's
        state brought back the snapshot's), and the rate follows from them at the step reached."""
        scheduler = self.scheduler
        if self._warmup is None or scheduler is None:
            return
        ramp = scheduler.lr_lambdas[0]
        ramp.factor, ramp.warmup_steps = self._warmup
        for group, base in zip(self.optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * ramp(scheduler.last_epoch)

    def _own_parts(self, path: Path, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The parts of snapshot ``path`` this rank needs: its own when the snapshot was written by as many
        ranks as there are now (unless the strategy needs every part, to consolidate shards of the
        optimizer state), else every rank's, in rank order (to merge); none when it has none."""
        count = int(body.get("parts") or 0)
        if not count:
            return []
        assert self.snapshots is not None
        if count == self.strategy.world_size:
            own = self.snapshots.load_part(path, self.strategy.rank)
            if not self.strategy.wants_every_part(own):
                return [own]
        return [self.snapshots.load_part(path, rank) for rank in range(count)]

    def load_state(self, body: dict[str, Any], path: Path | str = "<state>",
                   parts: list[dict[str, Any]] | None = None, mine: bool = True) -> None:
        """Restore model, optimizer, scheduler, scaler, counters and RNGs from a snapshot body, with what
        each rank keeps of its own from ``parts`` (this rank's when ``mine``, else every rank's of a world
        of another size)."""
        s = self.strategy
        try:
            note = s.restore(self.train_model, self.optimizer, body, parts or [], mine)
            if note:
                self.out.warn(note)
            if self.scheduler is not None and body.get("scheduler") is not None:
                self.scheduler.load_state_dict(body["scheduler"])
            if self.scaler is not None and body.get("scaler") is not None:
                self.scaler.load_state_dict(body["scaler"])
            self.epoch, self.step = int(body["epoch"]), int(body["step"])
            self.batch_in_epoch = int(body["batch_in_epoch"])
        except (KeyError, RuntimeError, ValueError, TypeError) as exc:
            raise SnapshotError(f"{path} does not fit this model and optimizer ({exc}). HINT: use another "
                                "--snapshot-dir, or delete the snapshots there to start afresh.") from None
        # Each rank's share of an epoch is the same list of items when the ranks and the items are: then
        # its RNG goes on, and a position inside the epoch carries over to another batch size wherever
        # the items done fill whole new batches.
        same_shards = (int(body.get("world_size", -1)) == s.world_size
                       and int((body.get("run") or {}).get("train_items", self.train_loader.dataset_size))
                       == self.train_loader.dataset_size)
        if same_shards:
            rng.restore({key: rows[s.rank] for key, rows in body["rng"].items()})
        else:
            rng.seed_everything(self.config.seed + s.rank + 7919 * self.step)
        if self.batch_in_epoch:
            position = self._position_in(body) if same_shards else None
            if position is None:
                self.out.warn(f"{path} was written by {body.get('world_size')} rank(s) with batch size "
                              f"{body.get('batch_size')} in the middle of epoch {self.epoch + 1}; now "
                              f"{s.world_size} x {self.train_loader.batch_size} (accumulating "
                              f"{self.config.batches_per_allreduce}): that position does not carry over, "
                              f"so epoch {self.epoch + 1} restarts from its beginning.")
                self.batch_in_epoch = 0
            else:
                self.batch_in_epoch = position
                if body.get("epoch_totals") is not None:
                    self._epoch_totals = MetricTotals.of(body["epoch_totals"][s.rank])

    def _position_in(self, body: dict[str, Any]) -> int | None:
        """The snapshot's position in its epoch in batches of this run, None when it falls inside one
        (or inside an accumulation group); the ranks' shares of the epoch are the snapshot's."""
        done = self.batch_in_epoch * int(body.get("batch_size", self.train_loader.batch_size))
        batches, rest = divmod(done, self.train_loader.batch_size)
        if rest or batches % self.config.batches_per_allreduce:
            return None
        return batches


def final_metric(result: EpochResult, task: str) -> float:
    """Accuracy for classification, RMSE for regression."""
    return result.accuracy if task == "classification" else result.rmse


__all__ = ["Trainer", "final_metric"]
