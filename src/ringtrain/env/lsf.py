"""IBM LSF with ``jsrun``: ranks from ``JSM_NAMESPACE_*``, hosts from ``LSB_DJOB_RANKFILE``.

The rank file lists one host per slot; its first line is the launch (batch) node, which runs no
rank, so it is skipped. The main address is the first compute host, the node rank the index of
this host among the distinct compute hosts, the port 15000 + the last four digits of ``LSB_JOBID``.
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

_VARS = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE",
         "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LsfEnvironment(ClusterEnvironment):
    """A task started by ``jsrun`` in an LSF job."""

    name = "lsf"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """``LSB_JOBID`` with jsrun's ``JSM_NAMESPACE_RANK`` and ``JSM_NAMESPACE_SIZE``."""
        return all(name in environ for name in ("LSB_JOBID", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"))

    def compute_hosts(self) -> list[str]:
        """Distinct compute hosts of the rank file, in order (the launch node on line 1 left out)."""
        path = self.environ.get("LSB_DJOB_RANKFILE", "")
        if not path:
            return []
        return list(dict.fromkeys(nodefile_lines(path)[1:]))

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
        return not self.environ.get("LSB_DJOB_RANKFILE")

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
        raise ClusterEnvironmentError(f"lsf: this host {me!r} is not in LSB_DJOB_RANKFILE ({hosts}). "
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
