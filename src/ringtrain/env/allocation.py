"""The scheduler allocation around an MPI launch: its first host and its job id.

MPI launchers (mpirun, mpiexec.hydra, MVAPICH, PALS) number the processes but give no rendezvous
address. With their default mappings (by slot or by node, in host-file order) rank 0 runs on the
first host of the allocation, so that host is the main address when the job spans several nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.pbs import nodefile_lines
from ringtrain.env.slurm import expand_nodelist


def allocation_hosts(environ: Mapping[str, str]) -> list[str]:
    """Distinct hosts of the enclosing Slurm, PBS or LSF allocation, in order; empty outside one."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if nodelist:
        hosts = expand_nodelist(nodelist)
    elif environ.get("PBS_NODEFILE"):
        hosts = nodefile_lines(environ["PBS_NODEFILE"])
    elif environ.get("LSB_DJOB_RANKFILE"):
        hosts = nodefile_lines(environ["LSB_DJOB_RANKFILE"])[1:]  # line 1: LSF's launch node, no rank
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
