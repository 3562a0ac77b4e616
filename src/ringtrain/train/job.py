"""A built-in workload run: ``TrainJob`` (what to train), ``run_job`` (one rank), ``launch_job`` (all).

``ringtrain train`` builds a ``TrainJob`` from its flags and calls ``launch_job``. With one process
the job runs in the calling process; with more, each rank runs ``python -m ringtrain.train.worker``
on a JSON copy of the job, started through ``ringtrain run``'s launcher. A rank that meets bad input
(missing data, a damaged snapshot, ...) writes the message to an error file and exits 2, so the
caller can report it as a usage error rather than a crash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ringtrain.exceptions import JobError, SnapshotError
from ringtrain.train import resuming
from ringtrain.train.config import TrainerConfig
from ringtrain.train.metrics import EpochResult
from ringtrain.train.preemption import NOTE_NAME, PREEMPTED_EXIT, Preempted
from ringtrain.train.snapshots import SnapshotManager

OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """A built-in workload with its data, optimizer and Trainer settings."""

    workload: str
    """Registry name (``mnist``, ``movielens``, ...)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    nproc: int = 1
    """Ranks on this machine."""
    data_dir: str | None = None
    download: bool = False
    cache_dir: str | None = None
    subset: int | None = None
    """Keep at most this many items of each split (seeded choice)."""
    like: str | None = None
    """Synthetic images with the sizes of this data set (``mnist``, ``cifar10``, ``imagenet``)."""
    arch: str | None = None
    """Model architecture of the workload (None: its default)."""
    optimizer: str | None = None
    """``sgd``, ``adam`` or ``adamw`` (None: the workload's default)."""
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    results_json: str | None = None
    """Rank 0 writes the per-epoch results here as JSON (a metric that was not measured is ``null``)."""
    max_restarts: int = 0
    """Restart every rank up to this many times when one fails (``ringtrain run --max-restarts``)."""
    hang_timeout: float | None = None
    """Seconds without progress that end a stuck job (``ringtrain run --hang-timeout``; None: its default)."""
    watch: bool = True
    """Watch the ranks for a stuck or slow rank (``ringtrain run --no-watch``: off)."""
    min_np: int | None = None
    """Elastic (with max_np / host_discovery_script): fewest workers to go on with."""
    max_np: int | None = None
    """Elastic: most workers at once."""
    host_discovery_script: str | None = None
    """Elastic: command printing the available ``host[:slots]`` lines (default: this machine, nproc slots)."""
    node_launch: dict[str, Any] = field(default_factory=dict)
    """torchrun's node settings that were set (``LaunchConfig`` fields: ``nnodes``, ``node_rank``, ...; from
    the flags or torchrun's ``PET_*`` variables, as ``ringtrain run`` reads them), with ``num_proc`` when -np
    was given: the launcher places the ranks on the nodes (and completes them from a pod's variables).
    Empty: the ranks run on this machine alone."""
    ray: str | None = None
    """``--ray [ADDRESS]``: the ranks run on this Ray cluster (``ringtrain run --ray``), one node agent per
    Ray node; the job travels in the ranks' command line, not in a file of this machine. None: not on Ray."""

    @property
    def launched(self) -> bool:
        """The ranks are started by the launcher; otherwise the job runs in the calling process."""
        return self.nproc > 1 or self.elastic or bool(self.node_launch) or self.ray is not None

    @property
    def elastic(self) -> bool:
        """Run under ringtrain run's elastic driver (Horovod elastic, in process)."""
        return self.min_np is not None or self.max_np is not None or self.host_discovery_script is not None

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise JobError(f"-np {self.nproc} must be at least 1. HINT: use -np 1, or -np 2 for two ranks.")
        if self.max_restarts < 0:
            raise JobError(f"--max-restarts {self.max_restarts} must be at least 0. HINT: use e.g. "
                           "--max-restarts 3, or 0 for no restart.")
        if self.elastic:
            self._check_elastic()
        if self.ray is not None:
            self._check_ray()
        if self.subset is not None and self.subset < 1:
            raise JobError(f"--subset {self.subset} must be at least 1 item. HINT: use e.g. --subset 1000, "
                           "or leave it out for the whole dataset.")
        self._check_optimizer()
        if self.like is not None and self.workload != "synthetic":
            raise JobError(f"--like {self.like} shapes synthetic images; workload {self.workload!r} has data "
                           f"of its own. HINT: use ringtrain train synthetic --like {self.like}, "
                           "or drop --like.")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise JobError(f"--data-dir {self.data_dir} is not a folder. HINT: give the folder that holds "
                           f"the {self.workload} files, or leave --data-dir out (built-in or cached data).")

    def _check_optimizer(self) -> None:
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise JobError(f"--optimizer {self.optimizer!r} is not known. "
                           f"HINT: use one of {list(OPTIMIZERS)}.")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise JobError(f"--lr {self.lr} must be a positive number. HINT: use e.g. --lr 0.001.")
        for name, example in (("momentum", "0.9"), ("weight_decay", "0.0001")):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                flag = f"--{name.replace('_', '-')}"
                raise JobError(f"{flag} {value:g} must be a number >= 0. HINT: use e.g. {flag} {example}, or "
                               f"{flag} 0 for none.")

    def _check_elastic(self) -> None:
        low, high = self.min_np or 1, self.max_np
        if self.min_np is not None and self.min_np < 1 or high is not None and high < low:
            # only the flags that were given: a left-out one has no value to show (not None)
            given = " / ".join(f"--{name.replace('_', '-')} {value}" for name, value in
                               (("min_np", self.min_np), ("max_np", high)) if value is not None)
            raise JobError(f"{given} is not a range of worker counts with 1 <= MIN <= MAX. HINT: write "
                           "e.g. --min-np 1 --max-np 4.")
        if self.nproc < low or (high is not None and self.nproc > high):
            raise JobError(f"-np {self.nproc} lies outside --min-np {low} .. --max-np "
                           f"{high if high is not None else 'unbounded'}. HINT: start with a number of "
                           "workers between the two.")
        if self.trainer.strategy != "horovod":
            raise JobError(f"--strategy {self.trainer.strategy} cannot go on when a worker fails "
                           "(torch's process groups do not re-form in process). HINT: use --strategy "
                           "horovod with --min-np/--max-np.")
        if self.max_restarts:
            raise JobError(f"--max-restarts {self.max_restarts} cannot be combined with --min-np/"
                           "--max-np/--host-discovery-script: the elastic driver replaces failed workers "
                           "itself. HINT: drop --max-restarts, or drop the elastic flags for whole-job "
                           "restarts.")

    def _check_ray(self) -> None:
        if self.elastic:
            raise JobError("--ray cannot be combined with --min-np/--max-np/--host-discovery-script: elastic "
                           "jobs on Ray are not supported yet. HINT: drop the elastic flags (--max-restarts "
                           "restarts the whole job), or leave --ray out.")
        placed = sorted(set(self.node_launch) - {"num_proc", "nproc_per_node"})
        if placed:
            flags = ", ".join("--" + name.replace("_", "-") for name in placed)
            raise JobError(f"--ray cannot be combined with {flags}: Ray places the ranks itself. HINT: give "
                           "-np N (and --nproc-per-node K for K ranks on each Ray node).")
        if self.max_restarts and not self.trainer.snapshot_dir:
            raise JobError(f"--max-restarts {self.max_restarts} with --ray needs --snapshot-dir: a restart "
                           "resumes from the last snapshot, and the ranks on other Ray nodes cannot reach a "
                           "temporary folder of this machine. HINT: give --snapshot-dir a folder every Ray "
                           "node sees (a shared file system).")

    def to_json(self) -> str:
        """The job as JSON (the worker's input)."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "trainer"}
        body["trainer"] = self.trainer.as_dict()
        return json.dumps(body, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TrainJob:
        """The inverse of ``to_json``."""
        body = json.loads(text)
        body["trainer"] = TrainerConfig(**body["trainer"])
        return cls(**body)


class RankInputError(JobError):
    """Bad input met inside the ranks (the message of the lowest rank that met it).

    ``reported``: the launcher's root-cause report showed it already, so the caller says no more than
    that (a failure is told once).
    """

    def __init__(self, message: str, reported: bool = False) -> None:
        super().__init__(message)
        self.reported = reported


def build_optimizer(name: str, params: Any, lr: float, momentum: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """A torch optimizer by name."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def input_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean bad input (reported without a traceback, exit code 2)."""
    from ringtrain.workloads import DataError
    from ringtrain.workloads.registry import UnknownWorkloadError

    return (JobError, SnapshotError, DataError, UnknownWorkloadError)


def run_job(job: TrainJob) -> list[EpochResult]:
    """Train ``job`` as this rank (every rank of the job calls this); returns the epochs trained."""
    from ringtrain.train.trainer import Trainer
    from ringtrain.workloads import get_workload

    workload = get_workload(job.workload, **({"like": job.like} if job.like else {}))
    train_ds, test_ds = workload.datasets(data_dir=job.data_dir, download=job.download,
                                          cache_dir=job.cache_dir, subset=job.subset, seed=job.trainer.seed)
    # the same initial weights on every rank, whatever the strategy broadcasts
    torch.manual_seed(job.trainer.seed)
    model = workload.model(job.arch)
    d = workload.defaults
    optimizer = build_optimizer(job.optimizer or d.optimizer, model.parameters(), job.lr or d.lr,
                                d.momentum if job.momentum is None else job.momentum,
                                d.weight_decay if job.weight_decay is None else job.weight_decay)
    config = job.trainer
    if config.task != workload.task:
        config = config.replace(task=workload.task)
    trainer = Trainer(model, optimizer, workload.loss(), train_ds, test_ds, config)
    leave_group, failed = True, False
    try:
        history = trainer.train()
        if trainer.strategy.rank == 0:
            _report(trainer, history, job)
    except KeyboardInterrupt:
        # Ctrl-C stops every rank, maybe in the middle of a collective: leaving the process group would
        # wait for peers that are gone (for ever, in gloo's destructors). What matters is on disk already:
        # snapshots are written whole or not at all.
        leave_group = trainer.strategy.world_size == 1
        raise
    except Preempted:
        raise  # every rank stopped after the same step, its snapshot written: leave together
    except BaseException:
        failed = True  # the other ranks may be in a collective this rank never reaches: no last barrier
        raise
    finally:
        if leave_group:
            trainer.close(failed=failed)
    return history


def _report(trainer: Any, history: list[EpochResult], job: TrainJob) -> None:
    config = trainer.config
    if history:
        last = history[-1]
        metric = (f"test accuracy {100 * last.accuracy:.2f}%" if config.task == "classification"
                  else f"test RMSE {last.rmse:.4f}")
        total = sum(r.seconds for r in history)
        print(f"done: {len(history)} epoch(s) in {total:.1f}s, {metric}", flush=True)
    if trainer.snapshots is not None:
        latest = trainer.snapshots.latest()
        where = latest if latest else f"{trainer.snapshots.folder} (none written)"
        print(f"snapshot: {where}", flush=True)
    if job.results_json:
        rows = [dataclasses.asdict(r) for r in history]
        body = {"workload": job.workload, "world_size": trainer.strategy.world_size,
                "strategy": config.strategy, "epochs": rows,
                "resumed_from": str(trainer.resumed_from) if trainer.resumed_from else None,
                "snapshots": [dataclasses.asdict(t) for t in trainer.snapshot_saves]}
        write_json_atomically(Path(job.results_json), without_nan(body))


def without_nan(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, so that it is standard JSON.

    An epoch's metrics hold NaN where nothing was measured (no evaluation that epoch, accuracy of a
    regression); ``json.dumps`` would write a bare ``NaN``, which strict JSON readers refuse.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value


def write_json_atomically(path: Path, body: Any) -> None:
    """Write ``body`` as JSON to ``path`` through a temporary file, so no reader sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps(body, indent=1, allow_nan=False))
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def check_snapshot_dir(job: TrainJob) -> tuple[Path, dict[str, Any]] | None:
    """Fail early, before starting ranks, when snapshots cannot be written to the snapshot folder, none
    of those there can be resumed (damaged ones are skipped for older good ones), or the one the ranks
    would resume was written with settings that cannot change (``resuming.refusal``).

    Returns the snapshot the ranks will resume and its body (tensors mapped from the file, not read),
    or None when they start afresh.
    """
    config = job.trainer
    if not config.snapshot_dir:
        return None
    manager = SnapshotManager(config.snapshot_dir, config.keep_last)
    if config.save_every or config.save_every_steps:
        manager.check_writable()
    if not config.resume:
        return None
    path, body, _ = manager.load_newest(lazy=True)  # verified as the ranks verify it
    if path is None or body is None:
        return None
    problem = resuming.refusal(path, body, config.seed, resuming.OPTIMIZER_CLASSES[_optimizer_of(job)])
    if problem:
        raise SnapshotError(problem)
    return path, body


def check_optimizer_flags(job: TrainJob) -> None:
    """``--momentum`` sets SGD's momentum; Adam and AdamW have none, and would ignore it silently."""
    name = _optimizer_of(job)
    if job.momentum is not None and name != "sgd":
        default = "" if job.optimizer else f", {job.workload}'s default"
        raise JobError(f"--momentum {job.momentum:g} has no effect on the {name} optimizer (--optimizer "
                       f"{name}{default}): only SGD has a momentum setting. HINT: add --optimizer sgd, or "
                       "drop --momentum.")


def _optimizer_of(job: TrainJob) -> str:
    from ringtrain.workloads import get_workload

    return job.optimizer or get_workload(job.workload).defaults.optimizer


#: Exit codes of a launcher stopped by a signal (128 + its number), and the signal's name.
_STOPPED_BY = {128 + s: s.name for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def stopped_message(job: TrainJob, cause: str = "SIGINT") -> str:
    """What a person needs after stopping a run: the last snapshot written, and how to go on from it."""
    config = job.trainer
    head = f"ringtrain train: stopped ({cause})."
    if not config.snapshot_dir:
        return (f"{head} No snapshots were written, so running the same command starts afresh. HINT: add "
                "--save-every 1 (or --save-every-steps N) to be able to resume a stopped run.")
    latest = SnapshotManager(config.snapshot_dir, config.keep_last).latest()
    if latest is None:
        return (f"{head} No snapshot was written yet in {config.snapshot_dir} (the first comes at the end of "
                f"{_first_snapshot(config)}), so running the same command starts afresh.")
    age = max(time.time() - latest.stat().st_mtime, 0.0)
    where = (f"{head} Last snapshot: {latest} (after optimizer step {_step_of(latest)}, written "
             f"{_duration(age)} ago).")
    if not config.resume:
        return f"{where} Run the same command without --no-resume to resume from it."
    return f"{where} Run the same command again to resume from it."


def _first_snapshot(config: TrainerConfig) -> str:
    parts = []
    if config.save_every_steps:
        parts.append(f"optimizer step {config.save_every_steps}")
    if config.save_every:
        parts.append(f"epoch {config.save_every}")
    return " or ".join(parts) or "the run"


def _step_of(path: Path) -> int:
    digits = "".join(ch for ch in path.stem if ch.isdigit())
    return int(digits) if digits else 0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def launch_job(job: TrainJob) -> int:
    """Run ``job`` on ``job.nproc`` ranks; returns the exit code, or raises an ``input_errors()`` type.

    A run stopped by Ctrl-C (or SIGTERM, SIGHUP) says which snapshot was written last and that the
    same command resumes from it, and returns 128 + the signal's number.
    """
    from ringtrain.launch.stopping import at_forced_exit

    def say_stopped(cause: str) -> None:
        print(stopped_message(job, cause), file=sys.stderr, flush=True)

    check_optimizer_flags(job)
    resumed = check_snapshot_dir(job)
    if resumed is not None and resuming.finished(resumed[1], job.trainer.epochs):
        # said here, before any rank starts: they would only load the snapshot to find nothing to do
        path, body = resumed
        if os.environ.get("RANK", "0") != "0":  # a rank of `ringtrain run ... ringtrain train`: rank 0 tells
            return 0
        print(f"ringtrain train: {resuming.finished_message(path, body, job.trainer.epochs)}", flush=True)
        if job.results_json:
            write_json_atomically(Path(job.results_json), {
                "workload": job.workload, "world_size": int(os.environ.get("WORLD_SIZE", job.nproc)),
                "strategy": job.trainer.strategy, "epochs": [], "resumed_from": str(path)})
        return 0
    try:
        # The launcher's watchdog ends a stop that hangs with os._exit: say the same as a clean stop.
        with at_forced_exit(lambda signum: say_stopped(signal.Signals(signum).name)), \
                _forwarded_as_stop(job):
            code = _launch(job)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except Preempted as stop:  # one process: the Trainer ran here
        code = _say_preempted(str(stop))
    if code in _STOPPED_BY:
        say_stopped(_STOPPED_BY[code])
    return code


def _say_preempted(what: str) -> int:
    print(f"ringtrain train: {what}. Run the same command again to resume from it.", file=sys.stderr,
          flush=True)
    return PREEMPTED_EXIT


@contextlib.contextmanager
def _forwarded_as_stop(job: TrainJob) -> Iterator[None]:
    """The handled signals the launcher does not stop on itself (SIGUSR1) become its SIGTERM, which it
    passes to every rank and gives them their grace: the ranks handle it as the same graceful stop.

    While the ranks run under the launcher's agent, the agent's own handlers take SIGUSR1 and SIGUSR2
    instead and pass them on as themselves (launch/forwarding.py); this covers the rest (the elastic
    driver, the start-up before the agent, other handled signals)."""
    from ringtrain.launch.stopping import STOP_SIGNALS
    from ringtrain.train.preemption import parse_signals

    own = {signal.Signals[name] for name in STOP_SIGNALS}
    extra = [sig for sig in parse_signals(job.trainer.signals_to_handle) if sig not in own]
    if not job.launched or threading.current_thread() is not threading.main_thread():
        yield  # one process: the Trainer's own handlers take it
        return
    saved = {sig: signal.signal(sig, lambda *_: os.kill(os.getpid(), signal.SIGTERM)) for sig in extra}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _launch(job: TrainJob) -> int:
    if not job.launched:
        run_job(job)
        return 0
    from ringtrain.launch.config import LaunchConfig
    from ringtrain.launch.entry import launch
    from ringtrain.launch.temp_folders import make_temp_folder

    folder = make_temp_folder("ringtrain-train-")  # a SIGKILL'd launcher's is removed at the next start
    try:
        if job.max_restarts and not job.trainer.snapshot_dir:
            job = _with_restart_snapshots(job, folder / "snapshots")
        errors = folder / "errors"
        errors.mkdir()
        if job.ray is not None:
            # Ranks on other Ray nodes cannot read a file of this machine: the job goes in their command,
            # which reaches every node's agent in its config. The error folder serves the ranks on this
            # node; the others report through their agent's root-cause report.
            given = ("--job-json", json.dumps(json.loads(job.to_json()), separators=(",", ":")))
        else:
            spec = folder / "job.json"
            spec.write_text(job.to_json())
            given = ("--job", str(spec))
        command = (sys.executable, "-m", "ringtrain.train.worker", *given, "--error-dir", str(errors))
        # torchrun's node settings: the plan spreads the ranks over the nodes, -np (when given) in all
        settings = {"num_proc": None if job.node_launch else job.nproc, **job.node_launch}
        config = LaunchConfig(command=command, max_restarts=job.max_restarts, min_np=job.min_np,
                              max_np=job.max_np, host_discovery_script=job.host_discovery_script,
                              hang_timeout=job.hang_timeout, watch=job.watch, **settings)
        if job.ray is not None:
            # each rank's share of its Ray node: the threads it will run (1 unless --threads says more)
            config = dataclasses.replace(config, ray=job.ray,
                                         ray_cpus_per_rank=float(job.trainer.threads or 1))
        code = launch(config)
        messages = sorted(errors.glob("rank-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
        note = errors / NOTE_NAME
        if code != 0 and note.exists():  # the ranks stopped for a signal, their snapshot written
            return _say_preempted(note.read_text().strip())
        if code != 0 and messages:
            raise RankInputError(messages[0].read_text().strip(),
                                 reported=any(errors.glob("rank-*.reported")))
        return code
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _with_restart_snapshots(job: TrainJob, folder: Path) -> TrainJob:
    """A restart must not lose every epoch: without a snapshot folder, one lives as long as the job."""
    print(f"ringtrain train: --max-restarts {job.max_restarts} without --snapshot-dir: a restart resumes "
          "from the last epoch's snapshot, kept in a temporary folder until the job ends (give "
          "--snapshot-dir to keep them).", file=sys.stderr, flush=True)
    return dataclasses.replace(job, trainer=job.trainer.replace(snapshot_dir=str(folder), save_every=1))


def write_error(folder: str | os.PathLike[str], rank: int, message: str, reported: bool = False,
                name: str | None = None) -> None:
    """Leave a rank's input error where ``launch_job`` looks for it (atomically: never half a message).

    ``reported``: the launcher's root-cause report shows the message, so ``launch_job`` does not repeat it.
    ``name``: another file of that folder (the preemption note).
    """
    path = Path(folder) / (name or f"rank-{rank}.txt")
    if reported:  # before the message: launch_job reads the two together once the ranks have ended
        (Path(folder) / f"rank-{rank}.reported").touch()
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(message + "\n")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
