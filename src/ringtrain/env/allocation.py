"""The scheduler job around this process: the one place that tells Slurm, PBS and LSF jobs apart.

:func:`scheduler_job` answers with the environment object of the scheduler, in a fixed order (Slurm,
then PBS, then LSF), for two readers:

- the launcher (``ringtrain run``), which asks it for nodes, node rank, tasks per node, hosts and
  whether it runs inside an ``srun`` step, and never reads a scheduler's variable itself;
- MPI launchers (mpirun, mpiexec.hydra, MVAPICH, PALS), which number the processes but give no
  rendezvous address. With their default mappings (by slot or by node, in host-file order) rank 0
  runs on the first host of the allocation, so that host is the main address when the job spans
  several nodes.

The object describes the job, not necessarily this process: inside an ``srun --pty`` shell it is a
:class:`SlurmEnvironment` (the launcher must not start another ``srun`` from a step), and in an LSF
job without ``jsrun`` it is an :class:`LsfEnvironment` whose ranks nobody numbered yet. Detection of
this process's own rank stays with :func:`ringtrain.env.detect_environment`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.lsf import LsfEnvironment, lsf_slot_hosts
from ringtrain.env.pbs import PbsEnvironment, nodefile_lines
from ringtrain.env.slurm import SlurmEnvironment, SlurmShellEnvironment, in_srun_step

SchedulerJob = SlurmEnvironment | SlurmShellEnvironment | PbsEnvironment | LsfEnvironment


def scheduler_job(environ: Mapping[str, str]) -> SchedulerJob | None:
    """The Slurm, PBS or LSF job this process runs in, as its environment object; None outside one."""
    if environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"):
        return SlurmEnvironment(environ) if in_srun_step(environ) else SlurmShellEnvironment(environ)
    if environ.get("PBS_JOBID"):
        return PbsEnvironment(environ)
    if environ.get("LSB_JOBID"):
        return LsfEnvironment(environ)
    return None


def allocation_hosts(environ: Mapping[str, str]) -> list[str]:
    """Distinct hosts of the enclosing Slurm, PBS or LSF allocation, in order; empty outside one."""
    job = scheduler_job(environ)
    if isinstance(job, (SlurmEnvironment, SlurmShellEnvironment)):
        hosts = job.allocation_hosts()
    elif isinstance(job, PbsEnvironment):
        hosts = nodefile_lines(environ["PBS_NODEFILE"]) if job.host_file_variable else []
    elif isinstance(job, LsfEnvironment):
        hosts = lsf_slot_hosts(environ)
    else:
        hosts = []
    return list(dict.fromkeys(hosts))


def allocation_first_host(environ: Mapping[str, str]) -> str | None:
    """First host of the enclosing Slurm, PBS or LSF allocation, or None outside one."""
    hosts = allocation_hosts(environ)
    return hosts[0] if hosts else None


def allocation_job_id(environ: Mapping[str, str]) -> str | None:
    """The scheduler's job id (Slurm, PBS, LSF), or None outside a scheduler job."""
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "PBS_JOBID", "LSB_JOBID"):
        if environ.get(name):
            return environ[name]
    return None
