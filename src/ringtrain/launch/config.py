"""The resolved launch request: a frozen ``LaunchConfig`` built by the pure ``config_from_args``.

``config_from_args`` turns the parsed command line into values and checks them; it reads no
environment and touches no file except a ``--hostfile``. Where the job runs (Slurm, PBS, hosts) is
decided later by :mod:`ringtrain.launch.plan`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ringtrain.cli.errors import UsageError
from ringtrain.launch.hosts import HostSlots, parse_hostfile, parse_hosts


@dataclass(frozen=True)
class TuningFlag:
    """A horovodrun tuning flag that only sets a ``HOROVOD_*`` (or NCCL) variable for the workers."""

    flag: str
    dest: str
    variable: str
    kind: str  # "int", "float", "str", "true" (store_true -> "1"), "bool" (--x / --no-x -> 1/0)
    help: str
    scale: float = 1.0
    upper: float | None = None


TUNING_FLAGS: tuple[TuningFlag, ...] = (
    TuningFlag("--fusion-threshold-mb", "fusion_threshold_mb", "HOROVOD_FUSION_THRESHOLD", "float",
               "fuse allreduces up to this many MiB (0 disables fusion)", scale=1024 * 1024),
    TuningFlag("--cycle-time-ms", "cycle_time_ms", "HOROVOD_CYCLE_TIME", "float",
               "background negotiation cycle in milliseconds"),
    TuningFlag("--cache-capacity", "cache_capacity", "HOROVOD_CACHE_CAPACITY", "int",
               "response cache entries (0 disables)"),
    TuningFlag("--hierarchical-allreduce", "hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE",
               "bool", "allreduce within each host first, then across hosts (one rank per host), then "
               "broadcast within the host"),
    TuningFlag("--hierarchical-allgather", "hierarchical_allgather", "HOROVOD_HIERARCHICAL_ALLGATHER",
               "bool", "allgather within each host first, then across hosts (one rank per host), then "
               "broadcast within the host"),
    TuningFlag("--torus-allreduce", "torus_allreduce", "HOROVOD_TORUS_ALLREDUCE", "bool",
               "torus allreduce (accepted; ringtrain has none)"),
    # horovodrun's autotuner flags: accepted so that its command lines run, with one warning; listed
    # under --autotune only (see AUTOTUNE_NOTE for why ringtrain does not tune).
    TuningFlag("--autotune", "autotune", "HOROVOD_AUTOTUNE", "true",
               "horovodrun's autotuner, also --autotune-log-file, --autotune-warmup-samples, "
               "--autotune-steps-per-sample, --autotune-bayes-opt-max-samples and "
               "--autotune-gaussian-process-noise: accepted with a warning; ringtrain does not autotune, "
               "set --fusion-threshold-mb and --cycle-time-ms instead"),
    TuningFlag("--autotune-log-file", "autotune_log_file", "HOROVOD_AUTOTUNE_LOG", "str", argparse.SUPPRESS),
    TuningFlag("--autotune-warmup-samples", "autotune_warmup_samples", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
               "int", argparse.SUPPRESS),
    TuningFlag("--autotune-steps-per-sample", "autotune_steps_per_sample",
               "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "int", argparse.SUPPRESS),
    TuningFlag("--autotune-bayes-opt-max-samples", "autotune_bayes_opt_max_samples",
               "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "int", argparse.SUPPRESS),
    TuningFlag("--autotune-gaussian-process-noise", "autotune_gaussian_process_noise",
               "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "float", argparse.SUPPRESS, upper=1.0),
    TuningFlag("--timeline-filename", "timeline_filename", "HOROVOD_TIMELINE", "str",
               "write a Chrome-trace timeline to this file"),
    TuningFlag("--timeline-mark-cycles", "timeline_mark_cycles", "HOROVOD_TIMELINE_MARK_CYCLES", "true",
               "mark negotiation cycles in the timeline"),
    TuningFlag("--no-stall-check", "no_stall_check", "HOROVOD_STALL_CHECK_DISABLE", "true",
               "disable the stall inspector"),
    TuningFlag("--stall-check-warning-time-seconds", "stall_check_warning_time_seconds",
               "HOROVOD_STALL_CHECK_TIME_SECONDS", "int", "warn about stalled tensors after this many s"),
    TuningFlag("--stall-check-shutdown-time-seconds", "stall_check_shutdown_time_seconds",
               "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "int", "shut down after a stall of this many s"),
    TuningFlag("--gloo-timeout-seconds", "gloo_timeout_seconds", "HOROVOD_GLOO_TIMEOUT_SECONDS", "int",
               "timeout of gloo rendezvous and operations in seconds"),
    TuningFlag("--num-nccl-streams", "num_nccl_streams", "HOROVOD_NUM_NCCL_STREAMS", "int",
               "NCCL streams (accepted)"),
    TuningFlag("--thread-affinity", "thread_affinity", "HOROVOD_THREAD_AFFINITY", "str",
               "background thread affinity (accepted)"),
    TuningFlag("--mpi-threads-disable", "mpi_threads_disable", "HOROVOD_MPI_THREADS_DISABLE", "true",
               "MPI threading (accepted; ringtrain uses no MPI)"),
    TuningFlag("--log-without-timestamp", "log_without_timestamp", "HOROVOD_LOG_HIDE_TIME", "true",
               "hide timestamps in Horovod log lines (accepted; the engine writes none of its own)"),
    TuningFlag("--tcp", "tcp", "NCCL_IB_DISABLE", "true", "use TCP only for NCCL (sets NCCL_IB_DISABLE=1)"),
)


#: The one warning for any --autotune* flags. Horovod's autotuner searches fusion threshold, cycle time,
#: cache and hierarchical settings while training runs. Here DistributedOptimizer sends fixed-size
#: buckets and the thread that waits drives the rounds, so neither knob is on the path a tuner would
#: move, and every change would have to reach all ranks in the same round.
AUTOTUNE_NOTE = ("{flags}: accepted and ignored; ringtrain does not autotune. Set --fusion-threshold-mb, "
                 "--cycle-time-ms or RINGTRAIN_BUCKET_CAP_MB yourself (docs/horovod-conformance.md).")
#: What --mpi does here: nothing, said plainly.
MPI_NOTE = ("--mpi: ringtrain has no MPI mode; the ranks are started by ringtrain and communicate over "
            "torch.distributed (gloo for CPU tensors, NCCL for CUDA), exactly as without --mpi. To start "
            "them with mpirun instead, run `mpirun -np N python train.py`: hvd.init() reads MPI's ranks.")


@dataclass(frozen=True)
class LaunchConfig:
    """Everything ``launch`` needs, resolved from flags; nothing here is read again from argv."""

    command: tuple[str, ...]
    num_proc: int | None = None
    hosts: tuple[HostSlots, ...] | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    start_timeout: float = 30.0
    network_interfaces: tuple[str, ...] = ()
    output_filename: str | None = None
    verbose: bool = False
    check_build: bool = False
    log_level: str | None = None
    nnodes: tuple[int, int] | None = None
    nproc_per_node: int | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    standalone: bool = False
    max_restarts: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    horovod_shim: bool = True
    #: Variables every worker gets on top of the launcher's environment (tuning flags, NIC choice).
    worker_env: Mapping[str, str] = field(default_factory=dict)
    #: Internal, set by a multi-host driver for the agents it starts: slots per node, node host names.
    node_slots: tuple[int, ...] | None = None
    node_hosts: tuple[str, ...] | None = None
    failure_marker: bool = False
    watch_stdin: bool = False
    #: Warnings about flags that were accepted but change nothing here; printed by ``launch``.
    notes: tuple[str, ...] = ()

    def table(self) -> str:
        """The resolved configuration as an aligned two-column table (``--verbose``)."""
        rows = []
        for f in fields(self):
            value: Any = getattr(self, f.name)
            if f.name == "hosts" and value:
                value = ",".join(f"{h.host}:{h.slots}" for h in value)
            elif f.name == "worker_env":
                value = " ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
            elif f.name == "command":
                value = " ".join(value)
            rows.append((f.name, "-" if value is None else str(value)))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name.ljust(width)} : {value}" for name, value in rows)


def parse_nnodes(value: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX``, both at least 1."""
    parts = value.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or min(numbers) < 1 or numbers[0] > numbers[-1]:
        raise UsageError(f"--nnodes {value!r} is not N or MIN:MAX with 1 <= MIN <= MAX. "
                         "HINT: write e.g. --nnodes 2 or --nnodes 1:4.")
    return numbers[0], numbers[-1]


def parse_nproc_per_node(value: str) -> int:
    """A count, or ``cpu`` / ``gpu`` / ``auto`` as torchrun understands them."""
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count:
            return count
        if value == "auto":
            return os.cpu_count() or 1
        raise UsageError("--nproc-per-node gpu was given but no CUDA device is visible. "
                         "HINT: use a number or 'cpu', or run on a machine with GPUs.")
    raise UsageError(f"--nproc-per-node {value!r} is not a positive number, 'cpu', 'gpu' or 'auto'. "
                     "HINT: write e.g. --nproc-per-node 4.")


def tuning_env(args: argparse.Namespace) -> dict[str, str]:
    """The worker variables set by horovodrun's tuning flags that were given."""
    env: dict[str, str] = {}
    for spec in TUNING_FLAGS:
        value = getattr(args, spec.dest, None)
        if value is None or (value is False and spec.kind != "bool"):
            continue
        if spec.kind == "true":
            env[spec.variable] = "1"
        elif spec.kind == "bool":
            env[spec.variable] = "1" if value else "0"
        elif spec.kind in ("int", "float"):
            if value < 0:
                raise UsageError(f"{spec.flag} {value} must be >= 0. HINT: give a non-negative number.")
            if spec.upper is not None and value > spec.upper:
                raise UsageError(f"{spec.flag} {value} must lie in [0, {spec.upper:g}]. "
                                 f"HINT: give a value between 0 and {spec.upper:g}.")
            scaled = value * spec.scale
            env[spec.variable] = str(int(scaled)) if spec.kind == "int" or spec.scale != 1 else f"{scaled:g}"
        else:
            env[spec.variable] = str(value)
    return env


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Check and convert the parsed ``ringtrain run`` arguments (pure: reads only a --hostfile)."""
    command = tuple(args.command or ())
    if command and command[0] == "--":
        command = command[1:]
    if not command and not args.check_build:
        raise UsageError("no command to run. HINT: write the program after the options, "
                         "e.g. ringtrain run -np 2 python train.py.")
    if args.num_proc is not None and args.num_proc < 1:
        raise UsageError(f"-np {args.num_proc} must be at least 1. HINT: give the number of processes, "
                         "e.g. -np 2.")
    if args.hosts and args.hostfile:
        raise UsageError("-H and --hostfile were both given. HINT: list the hosts in one place only.")
    hosts = parse_hosts(args.hosts) if args.hosts \
        else parse_hostfile(args.hostfile) if args.hostfile else None
    for name in ("start_timeout", "max_restarts", "ssh_port", "master_port", "node_rank"):
        value = getattr(args, name)
        if value is not None and value < 0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value} must be >= 0. HINT: give a non-negative number.")
    if args.master_port is not None and args.master_port > 65535:
        raise UsageError(f"--master-port {args.master_port} is not a TCP port. HINT: use 1024..65535.")
    worker_env = tuning_env(args)
    nics = tuple(n.strip() for n in (args.network_interfaces or "").split(",") if n.strip())
    if nics:
        worker_env["GLOO_SOCKET_IFNAME"] = ",".join(nics)
        worker_env["NCCL_SOCKET_IFNAME"] = ",".join(nics)
        worker_env["HOROVOD_GLOO_IFACE"] = nics[0]
    if args.log_level:
        worker_env["HOROVOD_LOG_LEVEL"] = args.log_level
    worker_env["HOROVOD_START_TIMEOUT"] = f"{args.start_timeout:g}"
    nnodes = parse_nnodes(args.nnodes) if args.nnodes else None
    nproc_per_node = parse_nproc_per_node(args.nproc_per_node) if args.nproc_per_node else None
    if args.rdzv_backend and args.rdzv_backend not in ("static", "c10d"):
        raise UsageError(f"--rdzv-backend {args.rdzv_backend!r} is not supported. "
                         "HINT: use c10d (elastic) or static.")
    notes = []
    if getattr(args, "mpi", None):
        notes.append(MPI_NOTE)
    for name in ("mpi_args", "binding_args"):
        if getattr(args, name, None):
            notes.append(f"--{name.replace('_', '-')} accepted and ignored: no mpirun is started.")
    autotune = [spec.flag for spec in TUNING_FLAGS
                if spec.flag.startswith("--autotune") and getattr(args, spec.dest, None) is not None]
    if autotune:
        notes.append(AUTOTUNE_NOTE.format(flags=", ".join(autotune)))
    for spec in TUNING_FLAGS:
        if getattr(args, spec.dest, None) is not None and "(accepted" in spec.help:
            notes.append(f"{spec.flag} accepted; it has no effect in ringtrain yet.")
    return LaunchConfig(
        notes=tuple(notes),
        command=command,
        num_proc=args.num_proc,
        hosts=hosts,
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        start_timeout=float(args.start_timeout),
        network_interfaces=nics,
        output_filename=args.output_filename,
        verbose=bool(args.verbose),
        check_build=bool(args.check_build),
        log_level=args.log_level,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        node_rank=args.node_rank,
        rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        standalone=bool(args.standalone),
        max_restarts=args.max_restarts,
        master_addr=args.master_addr,
        master_port=args.master_port,
        horovod_shim=not args.no_horovod_shim,
        worker_env=worker_env,
        node_slots=tuple(int(s) for s in args.node_slots.split(",")) if args.node_slots else None,
        node_hosts=tuple(args.node_hosts.split(",")) if args.node_hosts else None,
        failure_marker=bool(args.failure_marker),
        watch_stdin=bool(args.watch_stdin),
    )
