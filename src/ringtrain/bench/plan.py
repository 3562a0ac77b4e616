"""What a sweep will run: the checked settings (``BenchSettings``) and the ordered list of runs.

Every run is a fresh process tree. The single-process baseline is a plain ``python`` process (no
launcher, no process group); every other run goes through ``ringtrain run -np N`` (with ``-H`` or
``--hostfile`` across hosts). Competitors are interleaved: each repeat visits every configuration
once, so a machine whose speed drifts during the sweep slows all competitors alike, instead of
whichever happened to run last.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringtrain.exceptions import UsageError
from ringtrain.exchange import DEFAULT_POWERSGD_RANK, Method, local_sgd

FP32 = Method("none")

#: PowerSGD sends its first steps uncompressed (``start_iter`` of ``Compression.powersgd`` and of the DDP
#: strategy's hook, 10 by default): timing them would measure fp32 gradients under PowerSGD's name.
POWERSGD_PLAIN_STEPS = 10
#: The fewest warm-up steps of a PowerSGD run: its plain steps, then one compressed step that allocates
#: the factors and its error feedback, then one more, so that the first timed step is a steady one.
POWERSGD_WARMUP = POWERSGD_PLAIN_STEPS + 2
#: DiLoCo's outer optimizer (Douillard et al. 2023): SGD with Nesterov momentum on the averaged deltas.
DILOCO_OUTER_LR = 0.7
DILOCO_OUTER_MOMENTUM = 0.9
#: A strategy name: a base, and for ``ddp`` and ``horovod`` an optional suffix ``-fp16``, ``-bf16``,
#: ``-powersgd[R]`` (PowerSGD's rank, 4 when left out), ``-localsgdH`` or ``-dilocoH`` (the steps
#: between two averagings).
_NAME = re.compile(r"(?P<base>[a-z0-9]+)(?:-(?P<kind>fp16|bf16|powersgd|localsgd|diloco|[a-z0-9]+?)"
                   r"(?P<number>\d*))?")


@dataclass(frozen=True)
class StrategySpec:
    """What a ``--strategies`` name means: the Trainer's strategy and how its gradients travel."""

    name: str
    """The name as tables show it (``horovod-powersgd`` is shown as ``horovod-powersgd4``)."""
    trainer: str
    """The Trainer's strategy: ``ddp`` or ``horovod``."""
    method: Method = FP32
    """How gradients cross the link (:mod:`ringtrain.exchange`); fp32 for the baseline and references."""
    outer_lr: float = 1.0
    """Local SGD's outer learning rate (DiLoCo: 0.7)."""
    outer_momentum: float = 0.0
    """Local SGD's outer Nesterov momentum (DiLoCo: 0.9)."""

    @property
    def compression(self) -> str:
        """``TrainerConfig.compression``: ``none``, ``fp16``, ``bf16`` or ``powersgd:R``."""
        return self.method.compression

    @property
    def sync_every(self) -> int | None:
        """``TrainerConfig.sync_every``: Local SGD's steps between averagings (None: every step)."""
        return self.method.sync_every if self.method.name == "localsgd" else None

    def warmup_steps(self, requested: int) -> int:
        """The untimed steps of a run: as requested, but PowerSGD's plain steps are never timed."""
        return warmup_for(self.method, requested)

    def timed_steps(self, requested: int | None) -> int | None:
        """Timed steps of a run: as requested, rounded up to whole averaging periods for Local SGD (a
        window that holds part of a period would count a share of its averagings that depends on where
        the window falls, not on the method)."""
        every = self.sync_every
        if requested is None or not every:
            return requested
        return math.ceil(requested / every) * every

    def trainer_settings(self) -> dict[str, Any]:
        """The ``TrainerConfig`` fields this name sets (the worker's spec carries them)."""
        return {"strategy": self.trainer, "compression": self.compression, "sync_every": self.sync_every,
                "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum}


def warmup_for(method: Method, requested: int) -> int:
    """The warm-up steps a run of ``method`` takes: at least :data:`POWERSGD_WARMUP` for PowerSGD."""
    return max(requested, POWERSGD_WARMUP) if method.name == "powersgd" else requested


STRATEGIES: dict[str, StrategySpec] = {
    "single": StrategySpec("single", "ddp"),  # world size 1: the Trainer starts no process group at all
    "ddp": StrategySpec("ddp", "ddp"),  # torch DDP; with a suffix, torch's fp16/bf16/PowerSGD comm hooks
    "horovod": StrategySpec("horovod", "horovod"),  # DistributedOptimizer; with a suffix, its Compression
    # N copies of the baseline at once on this machine, no communication: the ceiling the machine allows
    # (CPU clock under all-core load, shared caches and memory bandwidth, other users), not a way to train
    "independent": StrategySpec("independent", "ddp"),
    # N ranks of one job that train their own copies and wait for each other once per step, exchanging
    # 4 bytes: the cost of lockstep alone, measured (ringtrain.bench.barrier), not a way to train
    "barrier": StrategySpec("barrier", "horovod"),
}
"""The plain names ``--strategies`` accepts; ``ddp`` and ``horovod`` also take a suffix for how gradients
travel (:func:`strategy_spec` reads them)."""
INDEPENDENT = "independent"
BARRIER = "barrier"
#: Strategies that measure the machine rather than compete: no model validation, no projection.
REFERENCES = frozenset({INDEPENDENT, BARRIER})

BASELINE = "single"
#: The strategies a suffix applies to: the data-parallel ones.
SUFFIXED = ("ddp", "horovod")
STRATEGY_HINT = ("choose from single, ddp, horovod, independent, barrier, or ddp / horovod with a suffix "
                 "-fp16, -bf16, -powersgd (rank 4) or -powersgdR, -localsgdH or -dilocoH (averaging every "
                 "H steps), e.g. --strategies single,horovod,horovod-powersgd4,horovod-localsgd8")


def strategy_spec(name: str) -> StrategySpec:
    """What the strategy ``name`` means; a ValueError names the value and the fix."""
    name = name.strip()
    if name in STRATEGIES:
        return STRATEGIES[name]
    match = _NAME.fullmatch(name)
    if match is None or match["kind"] is None:
        raise ValueError(f"{name!r} is not a strategy. HINT: {STRATEGY_HINT}.")
    base, kind, digits = match["base"], match["kind"], match["number"]
    suffix = name.partition("-")[2]
    if base not in SUFFIXED:
        what = ("the single-process baseline" if base == BASELINE else "a reference that exchanges no "
                "gradients" if base in REFERENCES else "not a strategy")
        raise ValueError(f"{name!r}: only ddp and horovod take a suffix (-{suffix}); {base!r} is {what}. "
                         f"HINT: write ddp-{suffix} or horovod-{suffix}.")
    number = int(digits) if digits else None
    if kind in ("fp16", "bf16"):
        if number is not None:
            raise ValueError(f"{name!r}: -{kind} takes no number. HINT: write {base}-{kind}.")
        return StrategySpec(f"{base}-{kind}", base, Method(kind))
    if kind == "powersgd":
        rank = DEFAULT_POWERSGD_RANK if number is None else number
        if rank < 1:
            raise ValueError(f"{name!r}: PowerSGD's rank must be at least 1. HINT: write e.g. "
                             f"{base}-powersgd4 (rank 4; -powersgd alone is rank {DEFAULT_POWERSGD_RANK}).")
        return StrategySpec(f"{base}-powersgd{rank}", base, Method("powersgd", rank=rank))
    if kind in ("localsgd", "diloco"):
        if number is None or number < 1:
            given = "none given" if number is None else f"{number} given"
            raise ValueError(f"{name!r}: -{kind} needs the steps between two averagings, at least 1 "
                             f"({given}). HINT: write e.g. {base}-{kind}8 (an averaging every 8 steps).")
        if kind == "diloco":
            return StrategySpec(f"{base}-diloco{number}", base, local_sgd(number), DILOCO_OUTER_LR,
                                DILOCO_OUTER_MOMENTUM)
        return StrategySpec(f"{base}-localsgd{number}", base, local_sgd(number))
    raise ValueError(f"{name!r}: -{suffix} is not a suffix of {base}. HINT: {STRATEGY_HINT}.")


def method_of(strategy: str) -> Method | None:
    """How a competitor's gradients travel, or None for a name that is not a built-in strategy (a
    script's runs, a name of a newer ringtrain in an old result file)."""
    try:
        return strategy_spec(strategy).method
    except ValueError:
        return None


def is_competitor(strategy: str) -> bool:
    """True for a distributed strategy under test; False for the baseline and the references."""
    return strategy != BASELINE and strategy not in REFERENCES


#: What a launcher or scheduler sets to make a process one rank of many. A plain run (the baseline,
#: the independent copies) goes without them, so that inside a Slurm allocation or an mpirun it is
#: still one process alone and not a rank waiting for others.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PALS_", "MV2_", "I_MPI_", "HYDRA_", "HOROVOD_",
                     "TORCHELASTIC_", "PET_", "PBS_", "LSB_")
LAUNCHER_NAMES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                            "MASTER_PORT", "SLURMD_NODENAME", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"})

DEFAULT_STRATEGIES = ("single", "ddp", "horovod")
DEFAULT_STEPS = 50
DEFAULT_WARMUP = 5
SCALINGS = ("weak", "strong")


def plain_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without the variables that would make a process a rank of a job."""
    return {k: v for k, v in environ.items()
            if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)}


def parse_np(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4): sorted, without duplicates; anything else is a UsageError."""
    values = []
    for part in text.split(","):
        word = part.strip()
        if not word:
            continue
        try:
            value = int(word)
        except ValueError:
            raise UsageError(f"--np {text}: {word!r} is not a whole number of processes. HINT: write a "
                             "comma-separated list of process counts, e.g. --np 1,2,4.") from None
        if value < 1:
            raise UsageError(f"--np {text}: {value} processes cannot run anything; every count must be at "
                             "least 1. HINT: write counts from 1 up, e.g. --np 1,2,4.")
        values.append(value)
    if not values:
        raise UsageError(f"--np {text!r} lists no process count. HINT: write e.g. --np 1,2,4.")
    return tuple(sorted(set(values)))


def parse_strategies(text: str) -> tuple[str, ...]:
    """``"single,horovod-powersgd"`` -> the names in the given order, as tables show them
    (``horovod-powersgd4``), each once; an unknown or malformed name is a UsageError."""
    names = []
    for part in text.split(","):
        word = part.strip()
        if not word:
            continue
        try:
            name = strategy_spec(word).name
        except ValueError as exc:
            raise UsageError(f"--strategies {text}: {exc}") from None
        if name not in names:
            names.append(name)
    if not names:
        raise UsageError(f"--strategies {text!r} names no strategy. HINT: e.g. --strategies single,horovod.")
    return tuple(names)


@dataclass(frozen=True)
class HostSpec:
    """One host of a multi-host sweep and its process slots."""

    name: str
    slots: int


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """A checked ``ringtrain bench`` request."""

    workload: str | None = None
    """Built-in workload name, or None for a user command."""
    command: tuple[str, ...] = ()
    """The user's program (``python train.py ...``) when no workload is given."""
    nps: tuple[int, ...] = (1, 2)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    steps: int | None = None
    epochs: int | None = None
    warmup_steps: int = DEFAULT_WARMUP
    scaling: str = "weak"
    repeats: int = 3
    arch: str | None = None
    batch_size: int | None = None
    """Weak scaling: items per step on each rank. Strong scaling: items per step over all ranks."""
    data_dir: str | None = None
    subset: int | None = None
    threads: int | None = None
    """torch threads per process (every rank and the baseline alike); None: cores / largest local -np."""
    hosts: tuple[HostSpec, ...] = ()
    """From -H or --hostfile; empty: this machine."""
    launcher_options: tuple[str, ...] = ()
    """Other ``ringtrain run`` options passed through (ssh port and key, interfaces, start timeout)."""
    out: Path = Path("bench-results")
    timeout_s: float = 1800.0
    link_probe: bool = True
    """Measure the link when the model needs it (``project`` or ``validate``); False: never."""
    project: bool = False
    """Add the cost model's projection to 8..1,024 ranks (table, JSON and a third panel of the plot)."""
    validate: bool = False
    """Put the cost model's efficiency beside every measured row and list its error."""
    link_note: str | None = None
    """Free text about the link, kept in scaling.json (e.g. how it was shaped)."""
    interconnects: tuple[Any, ...] = ()
    """Extra ``model.Interconnect`` entries for the projection."""
    seed: int = 0
    overwrite: bool = False
    """Replace an earlier sweep's files in ``out`` (only those) instead of refusing the folder."""
    extra_env: dict[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    """The command line as given (for scaling.json)."""

    def __post_init__(self) -> None:
        if self.workload is None and not self.command:
            raise UsageError("nothing to benchmark. HINT: name a workload (ringtrain bench mnist --np 1,2) "
                             "or a program after -- (ringtrain bench --np 1,2 -- python train.py).")
        for name in ("repeats", "warmup_steps"):
            value = getattr(self, name)
            low = 1 if name == "repeats" else 0
            if value < low:
                raise UsageError(f"--{name.replace('_', '-')} {value} must be at least {low}. "
                                 f"HINT: use e.g. --{name.replace('_', '-')} 3.")
        if self.scaling not in SCALINGS:
            raise UsageError(f"--scaling {self.scaling!r} is not known. HINT: use --scaling weak or strong.")
        if self.steps is not None and self.epochs is not None:
            raise UsageError(f"--steps {self.steps} and --epochs {self.epochs} were both given; a run is "
                             "timed over one or the other. HINT: drop one of them.")
        for name in ("steps", "epochs", "batch_size", "subset", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} {value} must be at least 1. HINT: use e.g. {flag} "
                                 f"{ {'steps': 50, 'epochs': 1, 'batch_size': 64}.get(name, 1)}.")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout {self.timeout_s:g} must be > 0 seconds. "
                             "HINT: use e.g. --timeout 1800.")
        if self.workload is None:
            self._check_script_flags()
        else:
            for name in self.strategies:
                try:
                    strategy_spec(name)
                except ValueError as exc:
                    raise UsageError(f"--strategies {','.join(self.strategies)}: {exc}") from None
        if self.hosts:
            slots = sum(h.slots for h in self.hosts)
            too_many = [n for n in self.nps if n > slots]
            if too_many:
                listing = ",".join(f"{h.name}:{h.slots}" for h in self.hosts)
                raise UsageError(f"--np {','.join(map(str, self.nps))}: {too_many[0]} processes do not fit "
                                 f"the {slots} slots of {listing}. HINT: lower --np to at most {slots}, "
                                 "or give the hosts more slots.")
        if self.scaling == "strong" and self.workload is not None and self.batch_size is not None:
            uneven = [n for n in self.nps if self.batch_size % n]
            if uneven:
                raise UsageError(f"--batch-size {self.batch_size} (the global batch in strong scaling) does "
                                 f"not split evenly over {uneven[0]} processes. HINT: use a batch size "
                                 f"divisible by every --np value, e.g. --batch-size {_lcm(self.nps) * 16}.")

    def _check_script_flags(self) -> None:
        """A script's sweep: the flags that shape a built-in workload's runs have nothing to shape."""
        given = [flag for flag, value in (("--steps", self.steps), ("--epochs", self.epochs),
                                         ("--arch", self.arch), ("--batch-size", self.batch_size),
                                         ("--data-dir", self.data_dir), ("--subset", self.subset))
                 if value is not None]
        if self.strategies != DEFAULT_STRATEGIES:
            given.append("--strategies")
        if self.scaling != "weak":
            given.append("--scaling")
        if given:
            raise UsageError(f"{', '.join(given)} only apply to built-in workloads; a script decides "
                             "its own steps, model and strategy. HINT: drop them, or pass them to "
                             "your script after --.")

    @property
    def probes_link(self) -> bool:
        """True when the sweep measures the link: only the model (--project, --validate) uses it."""
        return self.link_probe and (self.project or self.validate)

    @property
    def is_script(self) -> bool:
        """True for a user command, False for a built-in workload."""
        return self.workload is None

    @property
    def run_strategies(self) -> tuple[str, ...]:
        """The baseline first, then the distributed competitors (a script has one: ``script``)."""
        if self.is_script:
            return (BASELINE, "script")
        return (BASELINE, *(s for s in self.strategies if s != BASELINE))

    def timed_steps(self) -> int | None:
        """Timed optimizer steps per run (None with --epochs)."""
        if self.epochs is not None:
            return None
        return self.steps if self.steps is not None else DEFAULT_STEPS

    def steps_of(self, strategy: str) -> tuple[int, int | None]:
        """(warm-up steps, timed steps or None with --epochs) of a run of ``strategy``: PowerSGD's warm-up
        covers its uncompressed steps, Local SGD times whole averaging periods (:class:`StrategySpec`)."""
        if self.is_script or strategy not in self.run_strategies:
            return self.warmup_steps, self.timed_steps()
        spec = strategy_spec(strategy)
        return spec.warmup_steps(self.warmup_steps), spec.timed_steps(self.timed_steps())

    def strategy_settings(self) -> dict[str, dict[str, Any]]:
        """What each built-in strategy of the sweep runs with (for scaling.json): the Trainer's settings,
        the exchange method, and the warm-up and timed steps its runs take."""
        if self.is_script:
            return {}
        out = {}
        for name in self.run_strategies:
            spec = strategy_spec(name)
            warmup, steps = self.steps_of(name)
            out[name] = {**spec.trainer_settings(), "method": spec.method.label, "warmup_steps": warmup,
                         "steps": steps}
        return out

    def threads_per_process(self, cores: int) -> int:
        """torch threads of every process: as given, else the cores shared by the most local ranks."""
        if self.threads is not None:
            return self.threads
        if self.hosts:
            # ranks fill the hosts in order, so the first host holds the most of them
            local = max(min(n, self.hosts[0].slots) for n in self.nps)
        else:
            local = max(self.nps)
        return max(1, cores // max(1, local))

    def describe(self) -> dict[str, Any]:
        """The settings as plain values (for scaling.json)."""
        return {"workload": self.workload, "command": list(self.command), "np": list(self.nps),
                "strategies": list(self.run_strategies), "steps": self.timed_steps(), "epochs": self.epochs,
                "warmup_steps": self.warmup_steps, "scaling": self.scaling, "repeats": self.repeats,
                "arch": self.arch, "batch_size": self.batch_size, "data_dir": self.data_dir,
                "subset": self.subset, "threads": self.threads, "seed": self.seed,
                "hosts": [{"name": h.name, "slots": h.slots} for h in self.hosts],
                "launcher_options": list(self.launcher_options), "timeout_s": self.timeout_s,
                "link_note": self.link_note, "project": self.project, "validate": self.validate,
                "strategy_settings": self.strategy_settings()}


def _lcm(values: Sequence[int]) -> int:
    from math import lcm

    return lcm(*values)


@dataclass(frozen=True)
class RunSpec:
    """One run of the sweep: a configuration (strategy, processes) in one repeat."""

    index: int
    """Position in the sweep (0-based)."""
    repeat: int
    strategy: str
    np: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    copies: int = 1
    """Plain processes started at once from ``argv`` (``independent``); 1 for everything else."""
    plain: bool = False
    """True when ``argv`` is not started by a launcher (its environment loses the launcher variables)."""

    @property
    def label(self) -> str:
        """``np=2 horovod #1`` for progress lines and failure messages."""
        return f"np={self.np} {self.strategy} #{self.repeat + 1}"


def worker_spec(settings: BenchSettings, strategy: str, np: int, threads: int) -> dict[str, Any]:
    """What ``python -m ringtrain.bench.worker`` runs (its ``--spec`` JSON)."""
    spec = strategy_spec(strategy)
    warmup, steps = settings.steps_of(strategy)
    batch = settings.batch_size
    if settings.scaling == "strong" and batch is not None:
        batch //= np
    return {"workload": settings.workload, "arch": settings.arch, **spec.trainer_settings(),
            "bench_strategy": strategy, "batch_size": batch,
            "strong_scaling_over": np if settings.scaling == "strong" else None,
            "steps": steps, "epochs": settings.epochs,
            "warmup_steps": warmup, "threads": threads, "data_dir": settings.data_dir,
            "subset": settings.subset, "seed": settings.seed, "phases": strategy == BASELINE}


def launcher_argv(settings: BenchSettings, np: int, python: str = sys.executable) -> list[str]:
    """``ringtrain run -np N`` with the placement options of the sweep."""
    placement = ["-H", ",".join(f"{h.name}:{h.slots}" for h in settings.hosts)] if settings.hosts else []
    return [python, "-m", "ringtrain", "run", "-np", str(np), *placement, *settings.launcher_options]


def script_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What a script's plain runs add to the environment: the ``horovod`` shim on PYTHONPATH.

    ``ringtrain run`` puts the shim there for its ranks (unless real Horovod is importable); the
    one-process baseline of a Horovod-API script needs it just as much, or ``import horovod`` fails.
    """
    from ringtrain.shim import shim_pythonpath

    pythonpath = shim_pythonpath(dict(os.environ) if environ is None else environ)
    return {"PYTHONPATH": pythonpath} if pythonpath else {}


def same_python(command: list[str], python: str) -> list[str]:
    """A plain run's command with ``python``/``python3`` as ``python``, the interpreter running the bench:
    ``ringtrain run`` starts its ranks' ``python`` that way (launch/worker_entry.py), so the baseline
    imports from the same environment as the ranks it is compared with, activated or not."""
    from ringtrain.launch.worker_entry import is_python

    if command and is_python(command[0]):
        return [python, *command[1:]]
    return command


def bench_environment(settings: BenchSettings, threads: int) -> dict[str, str]:
    """What every run of the sweep adds to the environment: its threads, unbuffered output (a report
    line must not wait in a buffer until exit) and ``RINGTRAIN_BENCH=1``, without which
    :func:`ringtrain.bench.report` prints nothing (scripts stay quiet outside ``ringtrain bench``)."""
    from ringtrain.bench.hook import ENV_VAR

    return {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", ENV_VAR: "1", **settings.extra_env}


def plan_runs(settings: BenchSettings, threads: int, python: str = sys.executable) -> list[RunSpec]:
    """Every run of the sweep, in the order to run them (interleaved, repeat by repeat)."""
    configs: list[tuple[str, int]] = [(BASELINE, 1)]
    for strategy in settings.run_strategies[1:]:
        configs += [(strategy, n) for n in settings.nps if n > 1]
    # within a repeat: by process count, so competitors at the same size run back to back
    configs = [configs[0]] + sorted(configs[1:], key=lambda c: (c[1], settings.run_strategies.index(c[0])))
    env = bench_environment(settings, threads)
    runs: list[RunSpec] = []
    for repeat in range(settings.repeats):
        for strategy, np in configs:
            if settings.is_script:
                program = list(settings.command)
                if strategy in (BASELINE, INDEPENDENT):
                    program = same_python(program, python)
            else:
                spec = json.dumps(worker_spec(settings, strategy, np, threads), separators=(",", ":"))
                program = [python, "-m", "ringtrain.bench.worker", "--spec", spec]
            plain = strategy in (BASELINE, INDEPENDENT)
            argv = program if plain else [*launcher_argv(settings, np, python), *program]
            run_env = {**env, **script_environment()} if plain and settings.is_script else dict(env)
            runs.append(RunSpec(index=len(runs), repeat=repeat, strategy=strategy, np=np, argv=tuple(argv),
                                env=run_env, copies=np if strategy == INDEPENDENT else 1, plain=plain))
    return runs


STARTUP = "startup"
"""Strategy name of the start-up probes (:mod:`ringtrain.bench.startup`); never a row of the table."""


def startup_runs(settings: BenchSettings, threads: int, python: str = sys.executable) -> list[RunSpec]:
    """Runs measuring a script's start-up at every size, as its own runs are started (empty when the
    command is not ``python SCRIPT`` or ``python -m MODULE``): ``settings.repeats`` per size."""
    from ringtrain.bench.startup import probe_argv

    program = probe_argv(settings.command, python)
    if program is None:
        return []
    env = bench_environment(settings, threads)  # as the script's own runs: the same imports, same variables
    runs: list[RunSpec] = []
    for repeat in range(settings.repeats):
        for np in sorted({1, *settings.nps}):  # the baseline runs at one process whatever --np says
            plain = np == 1
            argv = same_python(program, python) if plain else [*launcher_argv(settings, np, python), *program]
            runs.append(RunSpec(index=len(runs), repeat=repeat, strategy=STARTUP, np=np, argv=tuple(argv),
                                env={**env, **script_environment()} if plain else dict(env), plain=plain))
    return runs
