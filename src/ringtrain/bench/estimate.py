"""How long a sweep will take, said before it starts (and again, better, after its first run).

An estimate, not a promise: runs x (start-up + steps x time per step x the machine's oversubscription).
For a built-in workload the time per step is measured here on one batch (the model's forward,
backward and optimizer step, with the threads of one process). Start-up is measured too: a fresh
interpreter importing what a run imports (``import_s``, timed in a child process while the step is
timed here) plus what loading the workload took here. A run started by ``ringtrain run`` adds the
launcher's own start (``import_s`` again), its ranks importing side by side on the cores (slower
when they outnumber them) and ``LAUNCH_OVERHEAD_S`` for the rendezvous; the link probe counts
``LINK_PROBE_S``. A script's duration is unknown until its first run; after the first run, every
estimate is rescaled by what that run really took.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ringtrain.bench.plan import BASELINE, BenchSettings, RunSpec

DEFAULT_STEP_S = 0.05
"""Seconds per step when the step could not be timed here (a default, said as such)."""
DEFAULT_IMPORT_S = 3.0
"""A fresh interpreter importing torch and the Trainer, when it could not be timed (a default)."""
LAUNCH_OVERHEAD_S = 2.0
"""The ranks' rendezvous under ``ringtrain run`` (a default)."""
LINK_PROBE_S = 20.0
"""The link probe, when the model needs it (a default)."""
BASELINE_PHASE_STEPS = 5
"""The baseline also times forward, backward and optimizer apart on a few more batches."""


@dataclass
class WorkloadTiming:
    """What measuring the workload here found: its training items, load time and time per step."""

    items: int
    batch: int
    """Items per step of one process (the global batch in strong scaling)."""
    load_s: float
    step_s: float | None
    """None: not measured (the default is used)."""
    import_s: float | None = None
    """A fresh interpreter importing what a run imports; None: not measured (the default is used)."""


def start_import_timer(python: str = sys.executable) -> tuple[subprocess.Popen[bytes], float] | None:
    """Start timing a fresh interpreter that imports what a built-in run imports (collect it with
    :func:`import_seconds`); None when it cannot start."""
    try:
        proc = subprocess.Popen([python, "-c", "import ringtrain.bench.worker"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    except OSError:
        return None
    return proc, time.perf_counter()


def import_seconds(timer: tuple[subprocess.Popen[bytes], float] | None,
                   timeout_s: float = 120.0) -> float | None:
    """The seconds the timer's interpreter took, or None when it failed or took too long."""
    if timer is None:
        return None
    proc, start = timer
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    return time.perf_counter() - start if code == 0 else None


def stop_import_timer(timer: tuple[subprocess.Popen[bytes], float] | None) -> None:
    """Stop the timer's interpreter (the sweep will not run)."""
    if timer is not None and timer[0].poll() is None:
        timer[0].kill()
        timer[0].wait()


def time_step(workload: Any, train_ds: Any, model: Any, batch: int, threads: int) -> float | None:
    """Seconds of one training step of ``model`` on one batch, with ``threads`` torch threads; None
    when the batch cannot be built here (the estimate then uses ``DEFAULT_STEP_S``)."""
    import torch
    from torch.utils.data import default_collate

    from ringtrain.bench.worker import time_phases

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        features, targets = default_collate([train_ds[i] for i in range(min(batch, len(train_ds)))])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        phases = time_phases(model, optimizer, workload.loss(), features, targets, repeats=2)
        return sum(phases.values())
    except Exception:  # an estimate must never stop the sweep
        return None
    finally:
        torch.set_num_threads(before)


def _local_ranks(settings: BenchSettings, np: int) -> int:
    return min(np, settings.hosts[0].slots) if settings.hosts else np


def run_seconds(settings: BenchSettings, run: RunSpec, timing: WorkloadTiming, threads: int,
                cores: int) -> float:
    """The estimated wall time of one built-in run."""
    step_s = timing.step_s if timing.step_s is not None else DEFAULT_STEP_S
    ranks_here = _local_ranks(settings, run.np)
    slowdown = max(1.0, ranks_here * threads / max(1, cores))
    if settings.epochs is not None:
        per_rank = timing.batch // run.np if settings.scaling == "strong" else timing.batch
        steps = math.ceil(timing.items / run.np / max(1, per_rank)) * settings.epochs
    else:  # PowerSGD's longer warm-up and Local SGD's whole periods included
        warmup, timed = settings.steps_of(run.strategy)
        steps = warmup + (timed or 0)
    if run.strategy == BASELINE:
        steps += BASELINE_PHASE_STEPS
    import_s = timing.import_s if timing.import_s is not None else DEFAULT_IMPORT_S
    startup = import_s * (1.0 if run.plain else max(1.0, ranks_here / max(1, cores))) + timing.load_s
    if not run.plain:  # the launcher starts first, then its ranks meet
        startup += import_s + LAUNCH_OVERHEAD_S
    if settings.scaling == "strong":  # the global batch split over the processes: smaller steps
        step_s /= run.np
    return startup + steps * step_s * slowdown


def sweep_seconds(settings: BenchSettings, runs: Sequence[RunSpec], timing: WorkloadTiming, threads: int,
                  cores: int) -> float:
    """The estimated wall time of every run, plus the link probe when it runs."""
    total = sum(run_seconds(settings, run, timing, threads, cores) for run in runs)
    return total + (LINK_PROBE_S if settings.probes_link else 0.0)


def duration(seconds: float) -> str:
    """``45 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plan_line(settings: BenchSettings, runs: Sequence[RunSpec], timing: WorkloadTiming | None, threads: int,
              cores: int) -> str:
    """The line printed before the sweep."""
    if timing is None:  # a script: nothing says how long it runs before it has run once
        return (f"bench: {len(runs)} run(s) of the script ({settings.repeats} repeat(s) of "
                f"{len(runs) // settings.repeats} configuration(s)); their duration is estimated after the "
                "first run")
    total = sweep_seconds(settings, runs, timing, threads, cores)
    step = (f"{timing.step_s * 1000:.1f} ms a step, measured here on one batch" if timing.step_s is not None
            else f"{DEFAULT_STEP_S * 1000:.0f} ms a step, a default (the step could not be timed here)")
    start = (f"{timing.import_s:.1f} s to import torch and the Trainer, measured"
             if timing.import_s is not None
             else f"{DEFAULT_IMPORT_S:.0f} s to import torch and the Trainer, a default")
    steps = f"{settings.epochs} epoch(s)" if settings.epochs is not None else \
        f"{settings.warmup_steps}+{settings.timed_steps()} steps"
    return (f"bench: estimate (not a measurement): about {duration(total)} for {len(runs)} run(s) x "
            f"{steps} at {step}, plus start-up ({start})"
            + (" and the link probe" if settings.probes_link else ""))


def after_first_line(first: RunSpec, first_s: float, rest: Sequence[RunSpec], settings: BenchSettings,
                     timing: WorkloadTiming | None, threads: int, cores: int) -> str:
    """The line printed after the first run: the rest of the sweep, scaled by what the first run took."""
    if not rest:
        return ""
    if timing is None:
        left = sum(first_s + (0.0 if run.plain else LAUNCH_OVERHEAD_S) for run in rest)
        how = "each run as long as the first"
    else:
        scale = first_s / max(1e-3, run_seconds(settings, first, timing, threads, cores))
        left = scale * sum(run_seconds(settings, run, timing, threads, cores) for run in rest)
        how = f"the plan's estimate x {scale:.2f}, what the first run took against its estimate"
    return (f"bench: the first run took {duration(first_s)}; estimate for the other {len(rest)} run(s): "
            f"about {duration(left)} ({how})")
