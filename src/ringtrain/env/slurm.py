"""Slurm: tasks started by ``srun`` (a job step), and the shell of a batch or interactive allocation.

Inside a step every task has ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the step's
sizes. The main address is the first host of the step's node list (rank 0 runs there with every
task distribution), the port 15000 + the last four digits of the job id, unless ``MASTER_ADDR`` /
``MASTER_PORT`` are set.

A batch script (``sbatch``), an ``salloc`` shell and an interactive ``srun --pty bash`` are *shells*:
one process, whatever ``SLURM_NTASKS`` says. Treating such a shell as rank 0 of ``SLURM_NTASKS`` is
the classic hang (a batch script that forgot ``srun``), so :class:`SlurmShellEnvironment` reports a
world of one, says in ``validate()`` that ``srun`` is missing, and exposes
:attr:`SlurmShellEnvironment.batch_without_srun` so the launcher can spread itself with ``srun``.

The interactive exemption: ``srun --pty`` (``SLURM_PTY_PORT`` set) makes a shell, not a rank. The
job *name* alone is not a safe sign: ``salloc`` names its job ``interactive`` and ``srun bash -c ...``
names it ``bash``, yet ``srun`` tasks inside such jobs are real ranks; the name only silences the
missing-``srun`` warning of a shell.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import (
    LOOPBACK,
    ClusterEnvironment,
    OneProcessEnvironment,
    port_from_job_id,
    read_int,
    same_host,
)
from ringtrain.env.hostlist import expand_nodelist, parse_tasks_per_node
from ringtrain.exceptions import ClusterEnvironmentError

__all__ = ["NON_SRUN_STEPS", "SlurmEnvironment", "SlurmJob", "SlurmShellEnvironment", "expand_nodelist",
           "in_slurm_step", "in_srun_step", "parse_tasks_per_node"]

#: Job names of interactive allocations (salloc, srun --pty bash): their shells start ranks by hand.
INTERACTIVE_JOB_NAMES = frozenset({"bash", "interactive"})
#: Step ids of the steps that are not ``srun``: the batch script, the extern step and an interactive step,
#: by name (Slurm >= 20) or as the 0xFFFFFFFx sentinels (batch 0xFFFFFFFE, extern 0xFFFFFFFF, ...).
NON_SRUN_STEPS = frozenset({"batch", "extern", "interactive", "4294967291", "4294967292", "4294967293",
                            "4294967294", "4294967295"})

_VARS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID",
         "SLURM_NODEID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NNODES", "SLURM_STEP_NUM_NODES",
         "SLURM_JOB_NUM_NODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
         "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURMD_NODENAME",
         "SLURM_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")

def _job_id(environ: Mapping[str, str]) -> str:
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""


def _is_pty(environ: Mapping[str, str]) -> bool:
    """An ``srun --pty`` shell: srun sets ``SLURM_PTY_PORT`` for it."""
    return "SLURM_PTY_PORT" in environ


def _is_interactive(environ: Mapping[str, str]) -> bool:
    return _is_pty(environ) or environ.get("SLURM_JOB_NAME", "") in INTERACTIVE_JOB_NAMES


def in_srun_step(environ: Mapping[str, str]) -> bool:
    """A task of an ``srun`` step (an ``srun --pty`` shell included): a step id that is not a sentinel."""
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    return step is not None and step not in NON_SRUN_STEPS and "SLURM_PROCID" in environ


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """A process of a Slurm step of any kind (the batch script's included): ``SLURM_STEP_ID`` is set.

    Slurm delivers a step's signals to every process of the step itself, so a launcher inside one must
    not send its ranks a second copy."""
    return bool(environ.get("SLURM_STEP_ID"))


class SlurmJob:
    """What every process of a Slurm job can read about the job, whether a step task or a shell."""

    environ: Mapping[str, str]

    @property
    def job_id(self) -> str:
        """``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``); empty outside a job."""
        return _job_id(self.environ)

    @property
    def job_nodes(self) -> int | None:
        """``SLURM_NNODES``: the nodes of the job (of the step, inside one); None when unset."""
        return read_int(self.environ, "SLURM_NNODES") if "SLURM_NNODES" in self.environ else None

    @property
    def in_srun_step(self) -> bool:
        """This process is a task of an ``srun`` step (an ``srun --pty`` shell included)."""
        return in_srun_step(self.environ)

    @property
    def max_tasks_per_node(self) -> int | None:
        """The most tasks any node of the allocation runs; None when unset or unreadable."""
        text = self.environ.get("SLURM_NTASKS_PER_NODE") or self.environ.get("SLURM_TASKS_PER_NODE", "")
        try:
            counts = parse_tasks_per_node(text) if text else []
        except ClusterEnvironmentError:
            return None
        return max(counts) if counts else None

    def allocation_hosts(self) -> list[str]:
        """Every host of the allocation, in order."""
        text = self.environ.get("SLURM_JOB_NODELIST") or self.environ.get("SLURM_NODELIST") or ""
        return expand_nodelist(text) if text else []


class SlurmEnvironment(SlurmJob, ClusterEnvironment):
    """A task of an ``srun`` step (not an interactive ``srun --pty bash``)."""

    name = "slurm"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """In a job step started by ``srun``, and not an ``srun --pty`` shell."""
        return bool(_job_id(environ)) and in_srun_step(environ) and not _is_pty(environ)

    def world_size(self) -> int:
        for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"):
            if name in self.environ:
                return read_int(self.environ, name)
        return 1

    def global_rank(self) -> int:
        return read_int(self.environ, "SLURM_PROCID", 0)

    def local_rank(self) -> int:
        return read_int(self.environ, "SLURM_LOCALID", 0)

    def local_world_size(self) -> int:
        """This node's entry of the step's (else the job's) compressed tasks-per-node list."""
        for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if self.environ.get(name):
                counts = parse_tasks_per_node(self.environ[name])
                node = self.node_rank()
                if 0 <= node < len(counts):
                    return counts[node]
        if "SLURM_NTASKS_PER_NODE" in self.environ:
            return read_int(self.environ, "SLURM_NTASKS_PER_NODE")
        return max(1, self.world_size() // self.num_nodes())

    def node_rank(self) -> int:
        return read_int(self.environ, "SLURM_NODEID", 0)

    def node_rank_is_derived(self) -> bool:
        return False

    def num_nodes(self) -> int:
        for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
            if name in self.environ:
                return read_int(self.environ, name)
        return len(self.step_hosts()) or 1

    def step_hosts(self) -> list[str]:
        """The step's hosts in order (the job's when the step list is absent)."""
        for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            if self.environ.get(name):
                return expand_nodelist(self.environ[name])
        return []

    def hostname(self) -> str:
        return self.environ.get("SLURMD_NODENAME") or super().hostname()

    def default_main_address(self) -> str:
        hosts = self.step_hosts()
        if hosts:
            return hosts[0]
        if self.num_nodes() == 1:
            return LOOPBACK
        raise ClusterEnvironmentError(
            "slurm: no SLURM_STEP_NODELIST / SLURM_JOB_NODELIST to find rank 0's host. "
            "HINT: export MASTER_ADDR=<host of rank 0>.")

    def default_main_port(self) -> int:
        job = _job_id(self.environ)
        return port_from_job_id(job) if job else super().default_main_port()

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _VARS if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        try:
            hosts, nodes = self.step_hosts(), self.num_nodes()
            if hosts and len(hosts) != nodes:
                warnings.append(f"slurm: the node list has {len(hosts)} hosts but the step has {nodes} "
                                "nodes. HINT: unset stale SLURM_* variables copied from another job.")
            if hosts and not any(same_host(self.hostname(), h) for h in hosts):
                warnings.append(f"slurm: this host {self.hostname()!r} is not in the node list {hosts}. "
                                "HINT: unset stale SLURM_* variables copied from another job.")
            theirs = {"SLURM_PROCID": self.global_rank(), "SLURM_NTASKS": self.world_size(),
                      "SLURM_LOCALID": self.local_rank()}
        except ClusterEnvironmentError as exc:
            return [*warnings, str(exc)]
        for torch_name, slurm_name in (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"),
                                       ("LOCAL_RANK", "SLURM_LOCALID")):
            value = self.environ.get(torch_name)
            if value is not None and value.strip() != str(theirs[slurm_name]):
                warnings.append(f"slurm: {torch_name}={value} disagrees with Slurm's {slurm_name}="
                                f"{theirs[slurm_name]}; Slurm's value is used. HINT: unset {torch_name}, or "
                                "start the processes with torchrun / ringtrain run, which set all of them.")
        return warnings


class SlurmShellEnvironment(SlurmJob, OneProcessEnvironment):
    """The one process of a batch script, ``salloc`` shell or ``srun --pty bash`` in an allocation."""

    name = "slurm-shell"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Inside a Slurm job but not in an ``srun`` task (or in an interactive one)."""
        return bool(_job_id(environ))

    @property
    def interactive(self) -> bool:
        """An interactive shell: ``srun --pty``, or a job named ``bash`` / ``interactive`` (salloc)."""
        return _is_interactive(self.environ)

    @property
    def allocated_tasks(self) -> int:
        """``SLURM_NTASKS`` of the allocation (1 when unset)."""
        return read_int(self.environ, "SLURM_NTASKS", 1)

    @property
    def batch_without_srun(self) -> bool:
        """The allocation asks for several tasks but only this process runs: ``srun`` is missing."""
        return not self.interactive and self.allocated_tasks > 1

    def tasks_per_node(self) -> list[int]:
        """The allocation's tasks on each host, expanded from ``SLURM_TASKS_PER_NODE``."""
        text = self.environ.get("SLURM_TASKS_PER_NODE", "")
        return parse_tasks_per_node(text) if text else []

    def default_main_port(self) -> int:
        return port_from_job_id(_job_id(self.environ))

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _VARS if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        try:
            missing = self.batch_without_srun
            tasks = self.allocated_tasks
        except ClusterEnvironmentError as exc:
            return [*warnings, str(exc)]
        if missing:
            warnings.append(f"slurm: the job has SLURM_NTASKS={tasks} but this process was not started by "
                            f"srun, so it runs alone (world size 1) instead of as one of {tasks} ranks. "
                            "HINT: start it with `srun python ...`, or with `srun ringtrain run "
                            "--nproc-per-node N ...` and --ntasks-per-node=1 (see `ringtrain script slurm`).")
        return warnings
