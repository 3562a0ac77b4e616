"""Processes started by an MPI launcher: Open MPI, MPICH / Intel MPI (Hydra), PMIx, MVAPICH, Cray PALS.

Each class names the variables its launcher sets; the rules they share live in
:class:`MpiEnvironment`:

- rank and size come from the launcher's variables (``WORLD_SIZE`` is accepted where a launcher
  gives no size, e.g. PALS without Cray PMI or a bare PMIx launch);
- a missing local rank / local size is guessed (all processes on this node, or the world spread
  evenly over the allocation's hosts) and ``validate()`` says so;
- main address, when ``MASTER_ADDR`` is not set: 127.0.0.1 when all processes are on this node;
  else the first host of the enclosing Slurm / PBS / LSF allocation (rank 0 runs there with the
  launchers' default by-slot and by-node mappings); else, for Open MPI, the host of ``mpirun``
  (``OMPI_MCA_orte_hnp_uri``); else an error asking for ``MASTER_ADDR``;
- port, when ``MASTER_PORT`` is not set: 15000 + the last four digits of the launcher's job id
  (``OMPI_MCA_ess_base_jobid``, ``PMIX_NAMESPACE``, ``PMI_JOBID``, ``PALS_APID``), else of the
  allocation's job id, else 29500. Every process of the job computes the same value.

``PMIX_SERVER_URI*`` is not used for the address: it names this node's PMIx server (the local
daemon, 127.0.0.1 under Open MPI 4.1), not rank 0's host.

Note that ``OMPI_COMM_WORLD_NODE_RANK`` is *not* a node index: Open MPI documents it as the rank of
the process among all processes on its node, so the node rank is derived from rank and local size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ringtrain.env.allocation import allocation_hosts, allocation_job_id
from ringtrain.env.base import (
    DEFAULT_PORT,
    LOOPBACK,
    ClusterEnvironment,
    port_from_job_id,
    read_int,
)
from ringtrain.exceptions import ClusterEnvironmentError


class MpiEnvironment(ClusterEnvironment):
    """Shared rules; subclasses list their launcher's variable names, most specific first."""

    #: Variables whose presence identifies the launcher (all must be set).
    detect_vars: tuple[str, ...] = ()
    rank_vars: tuple[str, ...] = ()
    size_vars: tuple[str, ...] = ()
    local_rank_vars: tuple[str, ...] = ()
    local_size_vars: tuple[str, ...] = ()
    node_rank_vars: tuple[str, ...] = ()
    num_nodes_vars: tuple[str, ...] = ()
    #: Launcher job ids a port can be derived from.
    job_id_vars: tuple[str, ...] = ()
    #: Other variables worth showing in ``ringtrain env``.
    extra_vars: tuple[str, ...] = ()

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return all(name in environ for name in cls.detect_vars)

    def _first(self, names: tuple[str, ...]) -> str | None:
        return next((name for name in names if self.environ.get(name, "").strip()), None)

    def _read(self, names: tuple[str, ...], what: str) -> int:
        name = self._first(names)
        if name is None:
            raise ClusterEnvironmentError(f"{self.name}: no variable gives the {what} (looked for "
                                    f"{', '.join(names)}). HINT: export {names[-1]}=<integer>.")
        return read_int(self.environ, name)

    def world_size(self) -> int:
        return self._read((*self.size_vars, "WORLD_SIZE"), "world size")

    def global_rank(self) -> int:
        return self._read(self.rank_vars, "rank")

    @property
    def local_values_guessed(self) -> bool:
        """No variable gave the local size: it is guessed (see the module docstring)."""
        return self._first((*self.local_size_vars, "LOCAL_WORLD_SIZE")) is None

    def local_world_size(self) -> int:
        name = self._first((*self.local_size_vars, "LOCAL_WORLD_SIZE"))
        if name is not None:
            return read_int(self.environ, name)
        hosts = len(allocation_hosts(self.environ))
        size = self.world_size()
        return -(-size // hosts) if hosts > 1 else size

    def local_rank(self) -> int:
        name = self._first((*self.local_rank_vars, "LOCAL_RANK"))
        if name is not None:
            return read_int(self.environ, name)
        return self.global_rank() % max(self.local_world_size(), 1)

    def node_rank(self) -> int:
        name = self._first(self.node_rank_vars)
        return read_int(self.environ, name) if name else super().node_rank()

    def node_rank_is_derived(self) -> bool:
        return self._first(self.node_rank_vars) is None

    def num_nodes(self) -> int:
        name = self._first(self.num_nodes_vars)
        return read_int(self.environ, name) if name else super().num_nodes()

    def launcher_main_address(self) -> str | None:
        """A launcher-specific guess at rank 0's host, tried after the allocation's first host."""
        return None

    def default_main_address(self) -> str:
        if self.is_single_node():
            return LOOPBACK
        hosts = allocation_hosts(self.environ)
        address = hosts[0] if hosts else self.launcher_main_address()
        if not address:
            raise ClusterEnvironmentError(
                f"{self.name}: the {self.world_size()} processes span several nodes and nothing says where "
                "rank 0 runs (no MASTER_ADDR, no Slurm/PBS/LSF allocation). HINT: export MASTER_ADDR=<host "
                "of rank 0> to every process, e.g. mpirun -x MASTER_ADDR=$(hostname) ...")
        return address

    def default_main_port(self) -> int:
        name = self._first(self.job_id_vars)
        job = self.environ[name] if name else allocation_job_id(self.environ)
        return port_from_job_id(job) if job else DEFAULT_PORT

    def source_variables(self) -> dict[str, str]:
        names = dict.fromkeys((*self.detect_vars, *self.rank_vars, *self.size_vars, *self.local_rank_vars,
                               *self.local_size_vars, *self.node_rank_vars, *self.num_nodes_vars,
                               *self.job_id_vars, *self.extra_vars, "WORLD_SIZE", "LOCAL_RANK",
                               "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
        return {k: self.environ[k] for k in names if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        try:
            guessed = self.local_values_guessed and self.world_size() > 1
            local = self.local_world_size() if guessed else 0
        except ClusterEnvironmentError:
            return warnings  # already reported by the shared checks
        if guessed:
            warnings.append(f"{self.name}: the launcher gave no local size; assuming {local} processes per "
                            "node. HINT: export LOCAL_RANK and LOCAL_WORLD_SIZE if that is wrong.")
        return warnings


class OpenMpiEnvironment(MpiEnvironment):
    """``mpirun`` / ``mpiexec`` of Open MPI (``OMPI_COMM_WORLD_*``)."""

    name = "openmpi"
    detect_vars = ("OMPI_COMM_WORLD_SIZE",)
    rank_vars = ("OMPI_COMM_WORLD_RANK",)
    size_vars = ("OMPI_COMM_WORLD_SIZE",)
    local_rank_vars = ("OMPI_COMM_WORLD_LOCAL_RANK",)
    local_size_vars = ("OMPI_COMM_WORLD_LOCAL_SIZE",)
    num_nodes_vars = ("OMPI_MCA_orte_num_nodes",)
    job_id_vars = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")
    extra_vars = ("OMPI_MCA_orte_hnp_uri",)

    def launcher_main_address(self) -> str | None:
        """The host of ``mpirun`` from ``OMPI_MCA_orte_hnp_uri`` (``jobid;tcp://10.0.0.1:port;...``)."""
        match = re.search(r"tcp://([^:;,/]+)", self.environ.get("OMPI_MCA_orte_hnp_uri", ""))
        return match.group(1) if match else None


class PalsEnvironment(MpiEnvironment):
    """Cray PALS (``mpiexec`` on HPE/Cray PBS systems)."""

    name = "pals"
    detect_vars = ("PALS_RANKID",)
    rank_vars = ("PALS_RANKID",)
    size_vars = ("PMI_SIZE",)
    local_rank_vars = ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK")
    local_size_vars = ("PMI_LOCAL_SIZE",)
    node_rank_vars = ("PALS_NODEID",)
    job_id_vars = ("PALS_APID",)
    extra_vars = ("PBS_JOBID", "PBS_NODEFILE")

    def num_nodes(self) -> int:
        """Distinct hosts of ``PBS_NODEFILE`` when present."""
        hosts = allocation_hosts(self.environ)
        return len(hosts) if hosts else super().num_nodes()


class MpichEnvironment(MpiEnvironment):
    """MPICH / Intel MPI (Hydra's ``PMI_RANK``, ``MPI_LOCALRANKID``), and Slurm's PMI-2 plugin."""

    name = "mpich"
    detect_vars = ("PMI_RANK", "PMI_SIZE")
    rank_vars = ("PMI_RANK",)
    size_vars = ("PMI_SIZE",)
    local_rank_vars = ("MPI_LOCALRANKID", "PMI_LOCAL_RANK")
    local_size_vars = ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")
    job_id_vars = ("PMI_JOBID",)


class MvapichEnvironment(MpiEnvironment):
    """MVAPICH2's ``mpirun_rsh`` / ``mpiexec`` (``MV2_COMM_WORLD_*``)."""

    name = "mvapich"
    detect_vars = ("MV2_COMM_WORLD_SIZE",)
    rank_vars = ("MV2_COMM_WORLD_RANK",)
    size_vars = ("MV2_COMM_WORLD_SIZE",)
    local_rank_vars = ("MV2_COMM_WORLD_LOCAL_RANK",)
    local_size_vars = ("MV2_COMM_WORLD_LOCAL_SIZE",)


class PmixEnvironment(MpiEnvironment):
    """A bare PMIx launch (``prterun``, Open MPI 5 without ``OMPI_*``): PMIx gives only the rank.

    The size comes from whatever else is set (``PMI_SIZE``, Slurm's step size, ``WORLD_SIZE``).
    """

    name = "pmix"
    detect_vars = ("PMIX_RANK",)
    rank_vars = ("PMIX_RANK",)
    size_vars = ("PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    local_rank_vars = ("MPI_LOCALRANKID", "SLURM_LOCALID")
    local_size_vars = ("MPI_LOCALNRANKS",)
    job_id_vars = ("PMIX_NAMESPACE",)
    extra_vars = ("PMIX_HOSTNAME",)
