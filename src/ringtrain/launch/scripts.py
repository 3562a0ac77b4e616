"""Job scripts: a ready ``sbatch`` / ``qsub`` file that runs a command through ``ringtrain run``.

Slurm: one task per node (``--ntasks-per-node=1``) started by ``srun``; each task is the
``ringtrain run`` agent of its node and starts ``--nproc-per-node`` ranks itself. PBS: the job
script runs one ``ringtrain run``, which reads the hosts from ``$PBS_NODEFILE`` and reaches the other
nodes over ssh. Pure functions: a :class:`JobScript` in, the script's text out.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ringtrain.engine.auth import export_secret_line

#: Scheduler names accepted by :func:`render`.
SCHEDULERS = ("slurm", "pbs")
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


@dataclass(frozen=True, kw_only=True)
class JobScript:
    """What the job needs; validated on construction (``ValueError`` naming the bad value)."""

    scheduler: str
    """``slurm`` or ``pbs``."""
    nodes: int
    """Number of nodes."""
    procs_per_node: int
    """Ranks per node (``ringtrain run --nproc-per-node``)."""
    command: tuple[str, ...]
    """The program and its arguments, run by every rank."""
    time: str | None = None
    """Wall-clock limit, ``HH:MM:SS`` (Slurm also takes ``D-HH:MM:SS`` and minutes)."""
    partition: str | None = None
    """Slurm partition, or PBS queue."""
    job_name: str = "ringtrain"
    """Job name shown by ``squeue`` / ``qstat``."""
    account: str | None = None
    """Account / project to charge."""
    output: str | None = None
    """Output file (default: Slurm ``ringtrain-%j.out``, PBS the scheduler's default)."""
    cpus_per_proc: int = 1
    """CPU cores reserved per rank."""
    gpus_per_node: int = 0
    """GPUs per node (0: none requested)."""
    python: str = "python3"
    """Interpreter that has ringtrain installed; the script runs ``PYTHON -m ringtrain run``."""
    setup: tuple[str, ...] = field(default_factory=tuple)
    """Shell lines run before the launch (``module load ...``, ``source venv/bin/activate``)."""
    pbs_resources: str = "select"
    """PBS resource syntax: ``select`` (PBS Pro/OpenPBS) or ``nodes`` (Torque ``nodes=N:ppn=M``)."""

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}. "
                             f"HINT: use one of {', '.join(SCHEDULERS)}.")
        for name in ("nodes", "procs_per_node", "cpus_per_proc"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(self, name)} must be at least 1. HINT: e.g. {flag} 2.")
        if self.gpus_per_node < 0:
            raise ValueError(f"--gpus-per-node {self.gpus_per_node} is negative. HINT: use 0 for none.")
        if not self.command:
            raise ValueError("no command to run. HINT: put it after --, e.g. "
                             "ringtrain script slurm --nodes 2 --procs-per-node 4 -- python train.py")
        if self.time is not None and not _TIME.match(self.time):
            raise ValueError(f"--time {self.time!r} is not a duration. HINT: write HH:MM:SS, e.g. 01:30:00.")
        if not _NAME.match(self.job_name):
            raise ValueError(f"--job-name {self.job_name!r} must be 1-64 letters, digits or . _ + -. "
                             "HINT: e.g. --job-name mnist-ddp.")
        if self.pbs_resources not in ("select", "nodes"):
            raise ValueError(f"--pbs-resources {self.pbs_resources!r} is unknown. HINT: use select "
                             "(PBS Pro, OpenPBS) or nodes (Torque).")
        for line in self.setup:
            if "\n" in line:
                raise ValueError(f"--setup {line!r} spans several lines. HINT: repeat --setup once per line.")


def _launch_line(job: JobScript, *flags: str) -> str:
    run = [job.python, "-m", "ringtrain", "run", *flags]
    return shlex.join(run) + " " + shlex.join(job.command)


def slurm_script(job: JobScript) -> str:
    """An ``sbatch`` script: one ``ringtrain run`` per node via ``srun``, each starting the node's ranks."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job.job_name}", f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={job.procs_per_node * job.cpus_per_proc}"]
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.time:
        lines.append(f"#SBATCH --time={job.time}")
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    if job.account:
        lines.append(f"#SBATCH --account={job.account}")
    lines.append(f"#SBATCH --output={job.output or 'ringtrain-%j.out'}")
    lines += [
        "",
        f"# {job.nodes} node(s) x {job.procs_per_node} rank(s): srun starts one `ringtrain run` per node,",
        "# which starts that node's ranks and meets the other nodes at the first host of the job.",
        "set -euo pipefail",
        *job.setup,
        "# The nodes start their ranks separately: they prove this per-job secret to each other.",
        export_secret_line(job.python),
        "",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        "    " + _launch_line(job, "--nproc-per-node", str(job.procs_per_node)),
        "",
    ]
    return "\n".join(lines)


def pbs_script(job: JobScript) -> str:
    """A ``qsub`` script: one ``ringtrain run`` that spreads the ranks over ``$PBS_NODEFILE``'s hosts."""
    cpus = job.procs_per_node * job.cpus_per_proc
    if job.pbs_resources == "select":
        resources = f"select={job.nodes}:ncpus={cpus}:mpiprocs={job.procs_per_node}"
        if job.gpus_per_node:
            resources += f":ngpus={job.gpus_per_node}"
    else:
        resources = f"nodes={job.nodes}:ppn={job.procs_per_node}"
        if job.gpus_per_node:
            resources += f":gpus={job.gpus_per_node}"
    lines = ["#!/bin/bash", f"#PBS -N {job.job_name}", f"#PBS -l {resources}"]
    if job.time:
        lines.append(f"#PBS -l walltime={job.time}")
    if job.partition:
        lines.append(f"#PBS -q {job.partition}")
    if job.account:
        lines.append(f"#PBS -A {job.account}")
    lines.append("#PBS -j oe")
    if job.output:
        lines.append(f"#PBS -o {job.output}")
    total = job.nodes * job.procs_per_node
    lines += [
        "",
        f"# {job.nodes} node(s) x {job.procs_per_node} rank(s): `ringtrain run` reads the hosts and slots",
        "# from $PBS_NODEFILE and starts each node's ranks (over ssh on the other nodes).",
        "set -euo pipefail",
        'cd "$PBS_O_WORKDIR"',
        *job.setup,
        "",
        _launch_line(job, "-np", str(total)),
        "",
    ]
    return "\n".join(lines)


def render(job: JobScript) -> str:
    """The job script for ``job.scheduler``."""
    return slurm_script(job) if job.scheduler == "slurm" else pbs_script(job)
