"""One process of a built-in workload's benchmark run: ``python -m ringtrain.bench.worker --spec JSON``.

The baseline runs it as a plain process; the other runs start it on every rank through ``ringtrain
run``. It trains with the same ``Trainer`` as ``ringtrain train`` (no evaluation), with the spec's
way of exchanging gradients (``compression``, Local SGD's ``sync_every`` and outer optimizer), times
every optimizer step, leaves the warm-up steps out (at least PowerSGD's uncompressed ones), and reports
through :func:`ringtrain.bench.report`, with the bytes its method hands to allreduces per step. The
baseline also times forward, backward and optimizer step apart (the projection model needs the
backward share of a step) and lists the parameters' shapes (the model's bytes for every method).

Bad input exits 2 with the message on stderr; anything else is a crash with its traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ringtrain.bench.barrier import BarrierStrategy
from ringtrain.bench.hook import ENV_VAR, parameters_digest, report
from ringtrain.bench.machine import boot_id, cpu_model
from ringtrain.bench.plan import BARRIER, warmup_for
from ringtrain.env.allocator import allocator_state
from ringtrain.env.binding import binding_state
from ringtrain.env.cores import usable_cores
from ringtrain.exchange import Method, local_sgd, parse_compression, wire_cost

#: Timed steps whose durations the report lists (``ringtrain bench`` derives the lockstep ceiling of
#: independent copies from them); past that, a report line would grow by ~8 bytes a step for nothing.
MAX_STEP_TIMES = 2000


def _rank_and_size() -> tuple[int, int]:
    from ringtrain.env import detect_environment

    placement = detect_environment().placement()
    return placement.rank, placement.world_size


def step_plan(items: int, world: int, batch: int, warmup: int, steps: int | None,
              epochs: int | None) -> tuple[int, int | None, list[int]]:
    """(epochs, max steps per epoch, items of this rank in each step) for a run of the Trainer.

    With ``steps``: only whole batches (a short last batch would make steps unequal), and the
    fewest epochs that hold ``warmup + steps`` steps, cut to equal lengths (so a few more steps may run;
    they are timed too). With ``epochs``: whole epochs as ``ringtrain train`` runs them.
    """
    per_rank = math.ceil(items / world)  # DistributedSampler pads every rank to this
    if steps is not None:
        whole = per_rank // batch
        if whole < 1:
            raise ValueError(f"a batch of {batch} per process needs at least {batch * world} items on "
                             f"{world} process(es); the dataset has {items}. HINT: lower --batch-size or "
                             "use a larger --subset.")
        total = warmup + steps
        n_epochs = math.ceil(total / whole)
        per_epoch = math.ceil(total / n_epochs)
        return n_epochs, per_epoch, [batch] * (n_epochs * per_epoch)
    assert epochs is not None
    in_epoch = [min(batch, per_rank - j * batch) for j in range(math.ceil(per_rank / batch))]
    return epochs, None, in_epoch * epochs


def exchange_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``TrainerConfig`` fields of how gradients travel, from a spec. Specs written before the other
    methods existed say ``fp16_allreduce`` (a bool) instead of ``compression``."""
    compression = spec.get("compression") or ("fp16" if spec.get("fp16_allreduce") else "none")
    return {"compression": compression, "sync_every": spec.get("sync_every"),
            "outer_lr": float(spec.get("outer_lr", 1.0)),
            "outer_momentum": float(spec.get("outer_momentum", 0.0))}


def exchange_method(exchange: dict[str, Any]) -> Method:
    """The :class:`~ringtrain.exchange.Method` of :func:`exchange_settings`' fields."""
    if exchange["sync_every"]:
        return local_sgd(int(exchange["sync_every"]))
    return parse_compression(exchange["compression"])


def whole_periods(steps: int, sync_every: int | None) -> int:
    """Of ``steps`` timed steps, those in whole Local SGD periods (all of them without Local SGD): the
    planned count is already a multiple of the period, but a run cut into equal epochs may run a few more.
    Fewer than one period: all of them (the report's steps then say how short the run was)."""
    if not sync_every or steps < sync_every:
        return steps
    return steps - steps % sync_every


def wire_report(shapes: list[tuple[int, ...]], method: Method, world: int,
                strategy: str | None) -> dict[str, Any]:
    """What this rank hands to allreduces per optimizer step (``wire_bytes_per_step``), how many times
    fewer bytes than fp32 gradients that is (``compression_ratio``) and the method's label (``fp32``,
    ``powersgd:4``, ``localsgd:8``). A run that exchanges no gradients (one process, the barrier's 4
    bytes) has no ratio and no method."""
    if world <= 1:
        return {"wire_bytes_per_step": 0.0, "compression_ratio": None, "method": None}
    if strategy == BARRIER:
        return {"wire_bytes_per_step": 4.0, "compression_ratio": None, "method": None}
    cost = wire_cost(shapes, method)
    return {"wire_bytes_per_step": cost.bytes_per_step, "compression_ratio": cost.ratio,
            "method": method.label}


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: CUDA runs asynchronously, so a host clock read right after a
    launch would time the launch, not the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_phases(model: torch.nn.Module, optimizer: Any, loss_fn: Any, features: Any, targets: Any,
                repeats: int, device: torch.device | None = None) -> dict[str, float]:
    """Median seconds of forward, backward and optimizer step on one batch (one process, no comms).

    ``device`` is the model's (default: CPU); the batch is moved there first.
    """
    from ringtrain.train.data import as_arguments, to_device

    device = device or torch.device("cpu")
    features, targets = to_device(features, device), to_device(targets, device)
    timings: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    model.train()
    for _ in range(repeats + 1):  # the first round warms the allocator and is dropped
        _synchronize(device)
        t0 = time.perf_counter()
        loss = loss_fn(model(*as_arguments(features)), targets)
        _synchronize(device)
        t1 = time.perf_counter()
        loss.backward()
        _synchronize(device)
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _synchronize(device)
        t3 = time.perf_counter()
        for key, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2)):
            timings[key].append(value)
    return {key: statistics.median(values[1:]) for key, values in timings.items()}


def run(spec: dict[str, Any]) -> str:
    """Train as one process of the run described by ``spec``; returns the report line it printed."""
    from ringtrain.train.config import TrainerConfig
    from ringtrain.train.job import build_optimizer
    from ringtrain.train.trainer import Trainer
    from ringtrain.workloads import get_workload

    rank, world = _rank_and_size()
    workload = get_workload(spec["workload"])
    train_ds, _ = workload.datasets(data_dir=spec.get("data_dir"), subset=spec.get("subset"),
                                    seed=spec.get("seed", 0))
    torch.manual_seed(spec.get("seed", 0))  # the same initial weights on every rank
    model = workload.model(spec.get("arch"))
    d = workload.defaults
    batch = spec.get("batch_size") or d.batch_size
    if spec.get("strong_scaling_over") and not spec.get("batch_size"):
        batch = max(1, d.batch_size // spec["strong_scaling_over"])
    optimizer = build_optimizer(d.optimizer, model.parameters(), d.lr, d.momentum, d.weight_decay)
    exchange = exchange_settings(spec)
    method = exchange_method(exchange)
    warmup = warmup_for(method, int(spec.get("warmup_steps", 0)))  # the plan's already; a hand-made spec too
    epochs, per_epoch, step_items = step_plan(len(train_ds), world, batch, warmup, spec.get("steps"),
                                              spec.get("epochs"))
    config = TrainerConfig(epochs=epochs, batch_size=batch, strategy=spec["strategy"], **exchange,
                           seed=spec.get("seed", 0), threads=spec.get("threads"), progress=False,
                           max_steps_per_epoch=per_epoch, task=workload.task, device=spec.get("device"))
    stamps: list[float] = []

    def stamp(trainer: Trainer) -> None:
        _synchronize(trainer.strategy.device)  # a step on a GPU ends when its kernels have run
        stamps.append(time.perf_counter())

    strategy = None
    if spec.get("bench_strategy") == BARRIER:
        strategy = BarrierStrategy(device=spec.get("device"))
    trainer = Trainer(model, optimizer, workload.loss(), train_ds, None, config, on_step=stamp,
                      strategy=strategy)
    try:
        start = time.perf_counter()
        trainer.train()
        phases = None
        if spec.get("phases") and world == 1:
            features, targets = next(iter(trainer.train_loader.epoch(0)))
            phases = time_phases(trainer.model, trainer.optimizer, trainer.loss_fn, features, targets,
                                 repeats=max(3, min(10, len(stamps) // 4)), device=trainer.strategy.device)
    finally:
        trainer.close()
    if len(stamps) <= warmup:
        raise RuntimeError(f"only {len(stamps)} steps ran, not more than the {warmup} warm-up steps")
    # the timed part starts when the last warm-up step ends (or when training starts, without warm-up)
    t0 = stamps[warmup - 1] if warmup else start
    timed = len(stamps) - warmup
    if spec.get("steps") is not None:  # with --epochs the timed part is whole epochs instead
        timed = whole_periods(timed, method.sync_every)
    kept = stamps[:warmup + timed]  # Local SGD: a step or two past the last whole period left out
    seconds = kept[-1] - t0
    items = sum(step_items[warmup:len(kept)])
    durations = [b - a for a, b in zip([t0, *kept[warmup:-1]], kept[warmup:])]
    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    wire = wire_report(shapes, method, world, spec.get("bench_strategy"))
    if spec.get("phases"):  # the baseline: the shapes give the cost model every method's bytes
        wire["parameter_shapes"] = [list(shape) for shape in shapes]
    digest = parameters_digest(model)
    return report(items=items, seconds=seconds, steps=timed, gradient_bytes=gradient_bytes, **wire,
                  warmup_steps=warmup, batch_size=batch, step_seconds_median=statistics.median(durations),
                  step_seconds_max=max(durations), items_per_epoch=math.ceil(len(train_ds) / world) * world,
                  steps_per_epoch=len(step_items) // epochs if spec.get("epochs") else None,
                  strategy=spec.get("bench_strategy"), threads=torch.get_num_threads(), cores=usable_cores(),
                  cpu=cpu_model(), boot_id=boot_id(), python=platform.python_version(), phases=phases,
                  pid=os.getpid(), malloc=allocator_state(), bind=binding_state(),
                  step_seconds=[round(d, 5) for d in durations[:MAX_STEP_TIMES]], parameters_digest=digest)


@record
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.bench.worker")
    parser.add_argument("--spec", required=True, help="the run as JSON (written by ringtrain bench)")
    args = parser.parse_args(argv)
    from ringtrain.train.job import input_errors

    # the worker exists to report: its line prints even when started by hand, outside a sweep
    os.environ.setdefault(ENV_VAR, "1")

    bad_input: tuple[type[BaseException], ...] = (*input_errors(), ValueError)
    try:
        run(json.loads(args.spec))
    except bad_input as exc:
        print(f"ringtrain bench: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
