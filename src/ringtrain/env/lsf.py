"""IBM LSF with ``jsrun``: ranks from ``JSM_NAMESPACE_*``, hosts from the job's host files.

LSF writes two host files, each one line per slot:

- ``LSB_DJOB_RANKFILE``, written for jobs whose ranks ``jsrun`` places (CSM clusters) and for
  ``bsub -hostfile``: its first line is the launch (batch) node, which runs no rank, so it is skipped;
- ``LSB_DJOB_HOSTFILE``, written for every parallel job: every line is an execution host, the first
  one runs the job script.

:func:`lsf_slot_hosts` reads the rank file when there is one (its layout is the one ``jsrun`` uses) and
the host file otherwise; the launcher and the MPI environments read the same function. The main
address is the first compute host, the node rank the index of this host among the distinct compute
hosts, the port 15000 + the last four digits of ``LSB_JOBID``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import (
    LOOPBACK,
    ClusterEnvironment,
    port_from_job_id,
    read_int,
    same_host,
)
from ringtrain.env.pbs import nodefile_lines
from ringtrain.exceptions import ClusterEnvironmentError

_VARS = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "LSB_DJOB_HOSTFILE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE",
         "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


def lsf_host_file(environ: Mapping[str, str]) -> str | None:
    """The variable naming the LSF host file to read: the rank file, else the host file; None if neither."""
    for name in ("LSB_DJOB_RANKFILE", "LSB_DJOB_HOSTFILE"):
        if environ.get(name):
            return name
    return None


def lsf_slot_hosts(environ: Mapping[str, str]) -> list[str]:
    """One compute host per slot of the LSF job, in order (the rank file's launch node left out)."""
    name = lsf_host_file(environ)
    if name is None:
        return []
    lines = nodefile_lines(environ[name])
    return lines[1:] if name == "LSB_DJOB_RANKFILE" else lines


class LsfEnvironment(ClusterEnvironment):
    """A task started by ``jsrun`` in an LSF job."""

    name = "lsf"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """``LSB_JOBID`` with jsrun's ``JSM_NAMESPACE_RANK`` and ``JSM_NAMESPACE_SIZE``."""
        return all(name in environ for name in ("LSB_JOBID", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"))

    @property
    def host_file_variable(self) -> str | None:
        """The variable whose file lists the job's hosts (see :func:`lsf_host_file`)."""
        return lsf_host_file(self.environ)

    def hosts(self) -> list[tuple[str, int]]:
        """The job's compute hosts and their slots, in order of first appearance."""
        counts: dict[str, int] = {}
        for host in lsf_slot_hosts(self.environ):
            counts[host] = counts.get(host, 0) + 1
        return list(counts.items())

    def compute_hosts(self) -> list[str]:
        """Distinct compute hosts of the job, in order (the rank file's launch node left out)."""
        return [host for host, _ in self.hosts()]

    def world_size(self) -> int:
        return read_int(self.environ, "JSM_NAMESPACE_SIZE")

    def global_rank(self) -> int:
        return read_int(self.environ, "JSM_NAMESPACE_RANK")

    def local_rank(self) -> int:
        return read_int(self.environ, "JSM_NAMESPACE_LOCAL_RANK", 0)

    def local_world_size(self) -> int:
        """``JSM_NAMESPACE_LOCAL_SIZE`` when given, else the world spread evenly over the hosts."""
        if "JSM_NAMESPACE_LOCAL_SIZE" in self.environ:
            return read_int(self.environ, "JSM_NAMESPACE_LOCAL_SIZE")
        return max(1, -(-self.world_size() // self.num_nodes()))

    def node_rank_is_derived(self) -> bool:
        return self.host_file_variable is None

    def num_nodes(self) -> int:
        return len(self.compute_hosts()) or 1

    def node_rank(self) -> int:
        hosts = self.compute_hosts()
        if not hosts:
            return 0
        me = self.hostname()
        for index, host in enumerate(hosts):
            if same_host(host, me):
                return index
        raise ClusterEnvironmentError(f"lsf: this host {me!r} is not in {self.host_file_variable} ({hosts}). "
                                "HINT: run inside the LSF job, or unset stale LSB_* variables.")

    def default_main_address(self) -> str:
        hosts = self.compute_hosts()
        if len(hosts) > 1:
            return hosts[0]
        return LOOPBACK

    def default_main_port(self) -> int:
        return port_from_job_id(self.environ["LSB_JOBID"])

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _VARS if k in self.environ}
