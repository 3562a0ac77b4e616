"""``ringtrain run``: horovodrun's and torchrun's flags in one parser, turned into a ``LaunchConfig``.

Every flag can also come from one environment variable, ``RINGTRAIN_<DEST>`` (for example
``RINGTRAIN_NPROC_PER_NODE=4`` or ``RINGTRAIN_NUM_PROC=2``); a flag on the command line wins. Long
flags accept both ``--dash-case`` and ``--snake_case``. A new flag touches this module and
:class:`~ringtrain.launch.config.LaunchConfig` only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringtrain.cli.node_options import (
    add_node_arguments,
    describe_sources,
    node_settings,
)
from ringtrain.cli.options import (
    EnvAppend,
    EnvFlag,
    EnvOption,
    at_least,
    hang_seconds,
    non_negative,
    record_sources,
    spellings,
)
from ringtrain.exceptions import SettingError, UsageError

# The launcher's modules are imported where a launch needs them: `ringtrain --version`, `--help` and the
# other commands that start nothing build this parser too and must stay quick.
if TYPE_CHECKING:
    from ringtrain.engine.settings import Knob
    from ringtrain.launch.config import LaunchConfig


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
    TuningFlag("--bind-to", "bind_to", "RINGTRAIN_BIND", "str",
               "none (the default) or core: each rank of a host runs on its own share of the physical "
               "cores, like mpirun --bind-to core (docs/engine.md)"),
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


def add_run_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Add every ``ringtrain run`` flag to ``parser``; defaults may come from ``environ``."""
    environ = os.environ if environ is None else environ

    def option(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*spellings(*names), action=EnvOption, environ=environ, **kwargs)

    def flag(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*spellings(*names), action=EnvFlag, environ=environ, **kwargs)

    nonneg_int, nonneg_float = non_negative(int), non_negative(float)
    option("-np", "--num-proc", dest="num_proc", type=int, metavar="N", help="total number of processes")
    option("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...", help="hosts and their slots")
    option("-hostfile", "--hostfile", dest="hostfile", metavar="FILE", help="file of 'host slots=N' lines")
    option("-p", "--ssh-port", dest="ssh_port", type=nonneg_int, help="ssh port of the remote hosts")
    option("-i", "--ssh-identity-file", dest="ssh_identity_file", metavar="FILE", help="ssh private key")
    flag("--gloo", dest="gloo", help="use gloo (the default; accepted for horovodrun compatibility)")
    flag("--mpi", dest="mpi", help="changes nothing: ringtrain has no MPI mode, ranks talk over gloo/NCCL "
         "either way (prints a note); to launch with mpirun, run mpirun yourself")
    option("--mpi-args", dest="mpi_args", help="accepted and ignored")
    option("--binding-args", dest="binding_args", help="accepted and ignored")
    flag("--disable-cache", dest="disable_cache", help="accepted (nothing is cached)")
    flag("--requeue", dest="requeue", help="inside a Slurm, PBS or LSF batch job: when the ranks end "
         "preempted (status 75, snapshot written), requeue the job (scontrol requeue, qrerun, brequeue) and "
         "exit 0; the requeued job resumes from the snapshot (docs/preemption.md)")
    option("--start-timeout", dest="start_timeout", type=nonneg_float, default="30",
           help="seconds allowed for reaching hosts and starting (default 30)")
    option("--hang-timeout", dest="hang_timeout", type=hang_seconds, metavar="SECONDS",
           help="end a job whose ranks made no progress for this long, with a report naming the rank "
           "the others wait for (default: 600 s, and only when that rank is not busy; docs/failures.md)")
    flag("--no-watch", dest="no_watch", help="do not watch the ranks for a stuck job (no stuck report, "
         "no hang timeout)")
    option("--network-interfaces", "--network-interface", dest="network_interfaces", metavar="NIC,...",
           help="network interfaces for gloo/NCCL (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)")
    option("--output-filename", dest="output_filename", metavar="DIR",
           help="also write each rank's output to DIR/rank.<N>/stdout and stderr")
    flag("--verbose", dest="verbose", help="print the resolved configuration and launcher steps")
    flag("--oversubscribe", dest="oversubscribe",
         help="run more threads (ranks x OMP_NUM_THREADS) than this machine has cores without a warning")
    flag("-cb", "--check-build", dest="check_build", help="print what this installation supports and exit")
    option("--log-level", dest="log_level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
           help="HOROVOD_LOG_LEVEL of the workers")
    parser.add_argument(*spellings("-x", "--export"), dest="export", action=EnvAppend, environ=environ,
                        metavar="NAME[=VALUE]",
                        help="give the workers this variable (mpirun's -x): NAME passes on the launcher's "
                             "value, NAME=VALUE sets it (repeatable)")
    tuning = parser.add_argument_group("tuning options (set HOROVOD_* variables of the workers)")
    for spec in TUNING_FLAGS:
        names = spellings(spec.flag)
        if spec.kind == "bool":
            tuning.add_argument(*names, dest=spec.dest, action=EnvFlag, environ=environ, const=True,
                                help=spec.help)
            tuning.add_argument(*spellings("--no-" + spec.flag[2:]), dest=spec.dest, action=EnvFlag,
                                environ={}, const=False, help=argparse.SUPPRESS)
        elif spec.kind == "true":
            tuning.add_argument(*names, dest=spec.dest, action=EnvFlag, environ=environ, help=spec.help)
        else:
            kind = {"int": nonneg_int, "float": nonneg_float, "str": str}[spec.kind]
            tuning.add_argument(*names, dest=spec.dest, action=EnvOption, environ=environ, type=kind,
                                help=spec.help)

    positive_int = at_least(int, 1)
    el = parser.add_argument_group("elastic options (horovodrun; any of the first three turns elastic on)")
    el.add_argument(*spellings("--min-np", "--min-num-proc"), dest="min_np", action=EnvOption,
                    environ=environ, type=positive_int, metavar="N",
                    help="fewest workers to train with; below it the job waits up to --elastic-timeout "
                         "(default -np)")
    el.add_argument(*spellings("--max-np", "--max-num-proc"), dest="max_np", action=EnvOption,
                    environ=environ, type=positive_int, metavar="N",
                    help="most workers at once (default: every slot found)")
    el.add_argument(*spellings("--host-discovery-script"), dest="host_discovery_script", action=EnvOption,
                    environ=environ, metavar="SCRIPT",
                    help="executable printing the available 'host[:slots]' lines; run every second")
    el.add_argument(*spellings("--slots-per-host", "--slots"), dest="slots_per_host", action=EnvOption,
                    environ=environ, type=positive_int, metavar="N",
                    help="slots of a discovered host printed without ':slots'")
    el.add_argument(*spellings("--elastic-timeout"), dest="elastic_timeout", action=EnvOption,
                    environ=environ, type=nonneg_float, metavar="SECONDS",
                    help="how long to wait for --min-np slots (default HOROVOD_ELASTIC_TIMEOUT or 600)")
    el.add_argument(*spellings("--reset-limit"), dest="reset_limit", action=EnvOption, environ=environ,
                    type=nonneg_int, metavar="N", help="most re-formations of the group before the job fails")
    el.add_argument(*spellings("--blacklist-cooldown-range"), dest="cooldown_range", action=EnvOption,
                    environ=environ, nargs=2, metavar=("MIN", "MAX"),
                    help="seconds a failing host stays blacklisted: MIN, doubling up to MAX (default: "
                         "for good)")

    ray = parser.add_argument_group("Ray options (one node agent per Ray node, as a Ray actor; needs "
                                    "pip install 'ringtrain[ray]')")
    ray.add_argument(*spellings("--ray"), dest="ray", action=EnvOption, environ=environ, nargs="?",
                     const="auto", metavar="ADDRESS",
                     help="run the ranks on a Ray cluster: the head's HOST:PORT, ray://HOST:PORT, or auto "
                          "(the default: RAY_ADDRESS, else the cluster `ray start` began on this machine)")
    ray.add_argument(*spellings("--ray-cpus-per-rank"), dest="ray_cpus_per_rank", action=EnvOption,
                     environ=environ, type=non_negative(float), default="1", metavar="N",
                     help="CPUs reserved on its Ray node for each rank (1)")
    ray.add_argument(*spellings("--ray-gpus-per-rank"), dest="ray_gpus_per_rank", action=EnvOption,
                     environ=environ, type=non_negative(float), default="0", metavar="N",
                     help="GPUs reserved on its Ray node for each rank; the node's ranks see them (0)")
    ray.add_argument(*spellings("--ray-placement-timeout"), dest="ray_placement_timeout", action=EnvOption,
                     environ=environ, type=non_negative(float), default="100", metavar="SECONDS",
                     help="how long the cluster may take to fit the ranks before the job fails (100)")

    tr = parser.add_argument_group("torchrun options (defaults also from torchrun's PET_<FLAG> variables)")

    def torchrun_option(*names: str, **kwargs: Any) -> None:
        # torchrun reads each of these from PET_<DEST>; Kubeflow's operators configure pods that way
        tr.add_argument(*names, torchrun=True, **kwargs)

    add_node_arguments(tr, environ)
    torchrun_option(*spellings("--max-restarts"), dest="max_restarts", action=EnvOption, environ=environ,
                   type=nonneg_int, default="0", help="restarts of the worker group before failing")
    tr.add_argument(*spellings("--no-horovod-shim"), dest="no_horovod_shim", action=EnvFlag, environ=environ,
                    help="do not put ringtrain's 'horovod' package on the workers' PYTHONPATH")
    torchrun_option(*spellings("-m", "--module"), dest="module", action=EnvFlag, environ=environ,
                   help="run the command as a Python module, as 'python -m MODULE ARGS'")
    torchrun_option(*spellings("--no-python"), dest="no_python", action=EnvFlag, environ=environ,
                   help="execute the command directly, even a .py file (not through Python)")
    torchrun_option(*spellings("--run-path"), dest="run_path", action=EnvFlag, environ=environ,
                   help="run the command as a Python file (runpy.run_path), whatever its name; "
                        "wins over --no-python")
    torchrun_option(*spellings("--log-dir"), dest="log_dir", action=EnvOption, environ=environ,
                   metavar="DIR",
                   help="keep every rank's stdout.log, stderr.log in DIR/<run id>_*/attempt_N/LOCAL_RANK/")
    torchrun_option(*spellings("--redirects"), dest="redirects", action=EnvOption, environ=environ,
                   metavar="N|LOCAL_RANK:N,...",
                   help="streams kept off the console, in the log files only (1 stdout, 2 stderr, 3 both)")
    torchrun_option(*spellings("--tee"), dest="tee", action=EnvOption, environ=environ,
                   metavar="N|LOCAL_RANK:N,...",
                   help="streams shown on the console and written to the log files (wins over --redirects)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                        help="program to run: 'python train.py ...', 'train.py ...' or any executable")
    record_sources(parser)


def parse_cooldown_range(value: Any) -> tuple[int, int]:
    """``--blacklist-cooldown-range MIN MAX`` (or ``RINGTRAIN_COOLDOWN_RANGE="MIN MAX"``)."""
    # imported here: the elastic host registry pulls in torch, which `ringtrain --version` must not pay for
    from ringtrain.launch.elastic_hosts import check_cooldown_range

    parts = value.split() if isinstance(value, str) else list(value)
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) != 2:
        raise UsageError(f"--blacklist-cooldown-range {' '.join(map(str, parts))!r} is not two whole numbers "
                         "of seconds. HINT: write e.g. --blacklist-cooldown-range 10 300.")
    return check_cooldown_range(numbers)


_ELASTIC_ONLY = ("slots_per_host", "elastic_timeout", "reset_limit", "cooldown_range")
_NOT_WITH_ELASTIC = ("nnodes", "nproc_per_node", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                     "standalone", "master_addr", "master_port")


def check_elastic_args(args: argparse.Namespace) -> int | None:
    """Refuse what cannot go with elastic mode; returns the number of workers to start with."""
    given = [name for name in _NOT_WITH_ELASTIC if getattr(args, name) not in (None, False)]
    if args.max_restarts:
        given.append("max_restarts")
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"{flags} cannot be combined with elastic mode (--min-np/--max-np/"
                         "--host-discovery-script): the elastic driver starts and re-forms the workers "
                         "itself. HINT: drop the torchrun flags, or drop the elastic ones for torchrun's "
                         "restarts.")
    if args.host_discovery_script and (args.hosts or args.hostfile):
        raise UsageError("--host-discovery-script and -H/--hostfile were both given. HINT: list the hosts in "
                         "one place: the script's output, or -H for a fixed set of hosts.")
    num_proc = args.num_proc if args.num_proc is not None else args.min_np
    if num_proc is None:
        raise UsageError("elastic mode needs -np (the workers to start with) or --min-np. HINT: add e.g. "
                         "-np 2 --min-np 1.")
    min_np = args.min_np if args.min_np is not None else num_proc
    if args.max_np is not None and args.max_np < min_np:
        raise UsageError(f"--max-np {args.max_np} is below --min-np {min_np}. HINT: give --max-np >= "
                         "--min-np.")
    if num_proc < min_np or (args.max_np is not None and num_proc > args.max_np):
        raise UsageError(f"-np {num_proc} lies outside --min-np {min_np} .. --max-np "
                         f"{args.max_np if args.max_np is not None else 'unbounded'}. HINT: start with a "
                         "number of workers between the two.")
    return num_proc


_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STREAMS = re.compile(r"^[0-3]$|^[0-9]+:[0-3](,[0-9]+:[0-3])*$")


def parse_exports(items: list[str]) -> dict[str, str | None]:
    """``-x NAME`` (None: the launcher's value) and ``-x NAME=VALUE``; the last one of a name wins."""
    exports: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _VARIABLE_NAME.match(name):
            raise UsageError(f"-x {item!r} names no variable ({name!r} is not a variable name). "
                             "HINT: write -x NAME to pass on the launcher's value or -x NAME=VALUE, "
                             "e.g. -x NCCL_DEBUG=INFO.")
        exports[name] = value if sep else None
    return exports


def parse_streams(flag: str, value: str | None) -> str | None:
    """torchrun's stream selector: ``N`` for every local rank, or ``LOCAL_RANK:N,...``; N in 0..3."""
    if value is None or _STREAMS.match(value.strip()):
        return value.strip() if value else value
    raise UsageError(f"{flag} {value!r} is not N or LOCAL_RANK:N,... with N in 0..3 (1 stdout, 2 stderr, "
                     f"3 both). HINT: write e.g. {flag} 3, or {flag} 0:3,1:2.")


def command_from_args(args: argparse.Namespace) -> tuple[tuple[str, ...], list[str]]:
    """The command the ranks run, with ``-m`` and ``--run-path`` applied; and notes about the choice."""
    from ringtrain.launch.worker_entry import is_python

    command = tuple(args.command or ())
    if command and command[0] == "--":
        command = command[1:]
    notes = []
    if args.module and args.no_python:
        raise UsageError("-m and --no-python were both given: a module needs Python. HINT: drop one of them.")
    if args.module and args.run_path:
        raise UsageError("-m and --run-path were both given. HINT: -m runs a module, --run-path a file; "
                         "keep the one that names what you run.")
    if command and (args.module or args.run_path) and is_python(command[0]):
        flag = "-m" if args.module else "--run-path"
        raise UsageError(f"{flag} takes what to run, not the interpreter: {' '.join(command[:3])!r}. "
                         f"HINT: write ringtrain run {flag} {' '.join(command[1:3])} ...")
    if command and args.module:
        command = ("python", "-m", *command)
    elif command and args.run_path:
        command = ("python", *command)
        if args.no_python:
            notes.append("--no-python has no effect with --run-path: the file runs as Python.")
    return command, notes


@dataclass(frozen=True)
class _FlagOfKnob:
    """A tuning flag seen through the knob it sets: the workers' rules, in the flag's words."""

    flag: str
    given: object
    knob: Knob

    def refuse(self, text: str, problem: str) -> SettingError:
        kind = self.knob.kind
        return SettingError(
            f"{self.flag} {self.given} sets {self.knob.variable}={text!r}, which {problem}: "
            f"{kind.requirement()}. HINT: leave {self.flag} out for the default ({self.knob.shown_default}) "
            f"or give {kind.expected()}.")


def tuning_env(args: argparse.Namespace) -> dict[str, str]:
    """The worker variables set by horovodrun's tuning flags that were given.

    Negative numbers never get here: the parser's types refuse them, from flags and variables alike.
    A value the workers' settings would refuse (``--gloo-timeout-seconds 0``) is refused here, with
    the same rule, so that no rank starts only to fail.
    """
    from ringtrain.engine.settings import knobs

    engine_knobs = {knob.variable: knob for knob in knobs()}
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
            if spec.upper is not None and value > spec.upper:
                raise UsageError(f"{spec.flag} {value} must lie in [0, {spec.upper:g}]. "
                                 f"HINT: give a value between 0 and {spec.upper:g}.")
            scaled = value * spec.scale
            env[spec.variable] = str(int(scaled)) if spec.kind == "int" or spec.scale != 1 else f"{scaled:g}"
        else:
            env[spec.variable] = str(value)
        knob = engine_knobs.get(spec.variable)
        if knob is not None:
            try:
                knob.kind.parse(_FlagOfKnob(spec.flag, value, knob), env[spec.variable])
            except SettingError as exc:
                raise UsageError(str(exc)) from None
    return env


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Check and convert the parsed ``ringtrain run`` arguments (pure: reads only a --hostfile)."""
    from ringtrain.launch.config import LaunchConfig
    from ringtrain.launch.hosts import parse_hostfile, parse_hosts

    command, notes = command_from_args(args)
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
    nodes = node_settings(args)  # also a PET_* switch that is not a boolean
    if args.mpi:
        notes.append(MPI_NOTE)
    for name in ("mpi_args", "binding_args"):
        if getattr(args, name):
            notes.append(f"--{name.replace('_', '-')} accepted and ignored: no mpirun is started.")
    autotune = [spec.flag for spec in TUNING_FLAGS
                if spec.flag.startswith("--autotune") and getattr(args, spec.dest, None) is not None]
    if autotune:
        notes.append(AUTOTUNE_NOTE.format(flags=", ".join(autotune)))
    for spec in TUNING_FLAGS:
        if getattr(args, spec.dest) is not None and "(accepted" in spec.help:
            notes.append(f"{spec.flag} accepted; it has no effect in ringtrain yet.")
    elastic = args.min_np is not None or args.max_np is not None or args.host_discovery_script is not None
    num_proc = args.num_proc
    if elastic:
        num_proc = check_elastic_args(args)
        if args.output_filename:
            notes.append("--output-filename has no effect in elastic mode yet: workers' output goes to this "
                         "terminal only.")
    else:
        for name in _ELASTIC_ONLY:
            if getattr(args, name) is not None:
                notes.append(f"--{name.replace('_', '-').replace('cooldown', 'blacklist-cooldown')} has no "
                             "effect without --min-np, --max-np or --host-discovery-script (elastic mode).")
    return LaunchConfig(
        notes=tuple(notes),
        command=command,
        num_proc=num_proc,
        hosts=hosts,
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        start_timeout=float(args.start_timeout),
        network_interfaces=tuple(n.strip() for n in (args.network_interfaces or "").split(",") if n.strip()),
        output_filename=args.output_filename,
        verbose=bool(args.verbose),
        check_build=bool(args.check_build),
        log_level=args.log_level,
        max_restarts=args.max_restarts,
        hang_timeout=args.hang_timeout,
        watch=not args.no_watch,
        **nodes,
        requeue=bool(args.requeue),
        horovod_shim=not args.no_horovod_shim,
        tuning=tuning_env(args),
        exports=parse_exports(args.export),
        no_python=bool(args.no_python) and not args.run_path,
        log_dir=args.log_dir,
        redirects=parse_streams("--redirects", args.redirects),
        tee=parse_streams("--tee", args.tee),
        min_np=args.min_np,
        max_np=args.max_np,
        slots_per_host=args.slots_per_host,
        host_discovery_script=args.host_discovery_script,
        elastic_timeout=args.elastic_timeout,
        reset_limit=args.reset_limit,
        cooldown_range=parse_cooldown_range(args.cooldown_range) if args.cooldown_range is not None else None,
        **ray_fields(args),
    )


#: Flags that place the ranks some other way: they cannot go with --ray.
_NOT_WITH_RAY = ("hosts", "hostfile", "nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "standalone",
                 "host_discovery_script")


def ray_address(value: str, example: str) -> str:
    """``--ray``'s value checked: ``HOST:PORT``, ``ray://HOST:PORT``, ``auto`` or ``local``; ``example``: a
    command line that puts a bare ``--ray`` before the other flags."""
    address = value.strip()
    if address not in ("auto", "local") and ":" not in address:
        raise UsageError(f"--ray {address!r} is not a Ray address. HINT: give the head's HOST:PORT (as `ray "
                         "start --head` printed it), ray://HOST:PORT or auto; with no address, put --ray "
                         f"before the other flags: {example}.")
    return address


def ray_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Ray fields of the config, checked (none but the defaults without --ray)."""
    if args.ray is None:
        return {}
    address = ray_address(args.ray, "ringtrain run --ray -np 2 python train.py")
    given = [name for name in _NOT_WITH_RAY if getattr(args, name, None) not in (None, False)]
    if given:
        flags = ", ".join("-H" if n == "hosts" else "--" + n.replace("_", "-") for n in given)
        discovery = "host_discovery_script" in given
        raise UsageError(f"--ray cannot be combined with {flags}: Ray places the ranks itself"
                         + (" (an elastic job on Ray finds its hosts in the cluster's nodes)"
                            if discovery else "")
                         + ". HINT: give -np N (and --nproc-per-node K for K ranks on each Ray node, or "
                         "--min-np/--max-np for an elastic job).")
    for flag, value in (("--ray-cpus-per-rank", args.ray_cpus_per_rank),
                        ("--ray-placement-timeout", args.ray_placement_timeout)):
        if not float(value) > 0:
            raise UsageError(f"{flag} {value} must be positive. HINT: e.g. {flag} 1.")
    return {"ray": address, "ray_cpus_per_rank": float(args.ray_cpus_per_rank),
            "ray_gpus_per_rank": float(args.ray_gpus_per_rank),
            "ray_placement_timeout": float(args.ray_placement_timeout)}


def run_command(args: argparse.Namespace) -> int:
    """Entry of ``ringtrain run``: flags -> ``LaunchConfig`` -> checks -> ``launch``."""
    from ringtrain.launch.entry import launch
    from ringtrain.launch.prechecks import before_launch

    config = config_from_args(args)
    if config.verbose:
        for line in describe_sources(args):
            print(f"ringtrain run: {line}", file=sys.stderr, flush=True)
    if not config.check_build:
        # what the ranks would each find later (a timeline they cannot write) is refused here, once
        for warning in before_launch(config, oversubscribe=bool(args.oversubscribe)):
            print(f"ringtrain run: warning: {warning}", file=sys.stderr, flush=True)
    return launch(config)


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="start a command on many processes and hosts (horovodrun / torchrun compatible)",
        description="Start COMMAND as -np ranks on this machine, on -H hosts over ssh, or inside a "
                    "Slurm/PBS allocation. Flags can also be set as RINGTRAIN_<FLAG> variables.",
        # No prefix matching: the command's own options (``train.py --out x``) would otherwise be taken
        # for abbreviations of ours (--output-filename) and refused as ambiguous.
        allow_abbrev=False,
    )
    add_run_arguments(parser)
    parser.set_defaults(func=run_command)
