"""Pods started by Kubernetes training operators: what each one sets, read as it is.

A pod of these operators is one *node* of the job: the operator expects a launcher (torchrun, or
``ringtrain run``) inside it to start the node's processes. So these classes describe the pod: its
node rank, the number of nodes and processes per node, and the rendezvous address. Run as one
process (``python train.py`` with one process per pod), a pod is rank ``node_rank * nproc`` with local
rank 0, which is right exactly when one process runs per pod; ``validate()`` says when it is not.

- Kubeflow Trainer v2, torch runtime: ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the
  Indexed Job's completion index), ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``; no ``RANK``.
- PyTorchJob (Training Operator v1): ``RANK`` = the pod's index (master 0, worker i = i + 1), which is a
  *node* rank; ``WORLD_SIZE`` = pods x ``nprocPerNode``; ``PET_NNODES``; ``PET_NPROC_PER_NODE`` when
  ``nprocPerNode`` is set; ``MASTER_ADDR`` / ``MASTER_PORT`` and their ``PET_`` twins; v1.9 also
  ``PET_NODE_RANK``. Elastic PyTorchJobs (an ``elasticPolicy``, no master) set ``PET_RDZV_BACKEND``,
  ``PET_RDZV_ENDPOINT``, ``PET_RDZV_ID``, ``PET_NNODES=MIN:MAX`` and no rank at all: the c10d
  rendezvous numbers the nodes.
- MPIJob (MPI Operator v2beta1), launcher pod: ``K_MPI_JOB_ROLE=launcher`` and, for Open MPI,
  ``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile`` (Intel MPI / MPICH: ``I_MPI_HYDRA_HOST_FILE``,
  ``HYDRA_HOST_FILE``) listing the workers as ``host slots=N`` (Open MPI) or ``host:N`` lines;
  ``/etc/mpi/discover_hosts.sh`` prints the running workers for elastic Horovod. The launcher itself
  trains nothing: it is one process, and ``ringtrain run`` starts the ranks on the hostfile's hosts.
- JobSet: an Indexed Job per replicated job, so ``JOB_COMPLETION_INDEX`` is the pod's index; JobSet
  sets no address, so the manifest names the coordinator (``MASTER_ADDR``, or ``PET_MASTER_ADDR``)
  and the node count (``PET_NNODES``); see docs/kubernetes.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ringtrain.env.base import DEFAULT_PORT, ClusterEnvironment, OneProcessEnvironment, read_int, read_port
from ringtrain.env.pbs import hosts_from_nodefile
from ringtrain.exceptions import ClusterEnvironmentError

#: Where an MPIJob launcher finds its workers, by MPI flavour (Open MPI, Intel MPI, MPICH).
HOSTFILE_VARIABLES = ("OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")
#: The MPI Operator's host discovery script, for ``--host-discovery-script``.
MPIJOB_DISCOVERY_SCRIPT = "/etc/mpi/discover_hosts.sh"
#: Short for the error every reader here raises: a value that cannot describe this pod.
_Invalid = ClusterEnvironmentError
_PET_VARS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
             "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_MAX_RESTARTS",
             "PET_STANDALONE")


def parse_nnodes_value(name: str, value: str) -> tuple[int, int]:
    """torchrun's ``--nnodes`` text (``N`` or ``MIN:MAX``) read from variable ``name``."""
    parts = value.strip().split(":")
    if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
        low, high = int(parts[0]), int(parts[-1])
        if 1 <= low <= high:
            return low, high
    raise _Invalid(f"{name}={value!r} is neither a number of nodes nor MIN:MAX. HINT: set "
                   f"{name} to e.g. 2 or 1:4 (the operator writes it from the replica "
                   "count or the elastic policy).")


class _PodEnvironment(ClusterEnvironment):
    """A pod that is one node of a torchrun-style job: nodes, processes per node, node rank."""

    #: Variables listed by ``ringtrain env``.
    variables: tuple[str, ...] = _PET_VARS

    def nnodes(self) -> tuple[int, int]:
        """The node count, or the elastic ``MIN:MAX`` range."""
        if "PET_NNODES" not in self.environ:
            raise _Invalid(f"{self.name}: PET_NNODES is not set, so the number of pods is "
                           "unknown. HINT: set PET_NNODES in the pod template.")
        return parse_nnodes_value("PET_NNODES", self.environ["PET_NNODES"])

    def nproc_per_node(self) -> int:
        """Processes each pod runs: ``PET_NPROC_PER_NODE`` when it is a number, else 1."""
        value = self.environ.get("PET_NPROC_PER_NODE", "").strip()
        if not value:
            return 1
        if value.isdigit() and int(value) > 0:
            return int(value)
        if value == "cpu":
            return os.cpu_count() or 1
        raise _Invalid(f"{self.name}: PET_NPROC_PER_NODE={value!r} is resolved by the "
                       "launcher on the node (it counts the GPUs). HINT: start the pod's processes "
                       "with `ringtrain run`, or set a number.")

    def pod_node_rank(self) -> int:
        """This pod's index among the job's pods."""
        return read_int(self.environ, "PET_NODE_RANK")

    def world_size(self) -> int:
        return self.nnodes()[1] * self.nproc_per_node()

    def global_rank(self) -> int:
        return self.pod_node_rank() * self.nproc_per_node()

    def local_rank(self) -> int:
        return 0

    def local_world_size(self) -> int:
        return self.nproc_per_node()

    def node_rank(self) -> int:
        return self.pod_node_rank()

    def num_nodes(self) -> int:
        return self.nnodes()[1]

    def node_rank_is_derived(self) -> bool:
        return False

    def default_main_address(self) -> str:
        return self.environ.get("PET_MASTER_ADDR", "").strip() or super().default_main_address()

    def default_main_port(self) -> int:
        if self.environ.get("PET_MASTER_PORT", "").strip():
            return read_port(self.environ, "PET_MASTER_PORT")
        return DEFAULT_PORT

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in self.variables if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        try:
            nodes, nproc, rank = self.nnodes()[1], self.nproc_per_node(), self.pod_node_rank()
        except ClusterEnvironmentError as exc:
            return list(dict.fromkeys([*warnings, str(exc)]))
        if not 0 <= rank < nodes:
            warnings.append(f"{self.name}: node rank {rank} is not below the {nodes} nodes of the job. "
                            "HINT: the pod's index and the node count come from different jobs; check "
                            "the pod template's variables.")
        if nproc > 1:
            warnings.append(f"{self.name}: the pod is one node of {nproc} processes; started as one "
                            "process it would leave the job waiting for the others. HINT: run it as "
                            "`ringtrain run python train.py` (which reads these variables).")
        return warnings


class TrainerV2Environment(_PodEnvironment):
    """A pod of Kubeflow Trainer v2's torch runtime: ``PET_NODE_RANK`` and no ``RANK``."""

    name = "kubeflow-trainer"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return "PET_NODE_RANK" in environ and "RANK" not in environ and "TORCHELASTIC_RUN_ID" not in environ


class PyTorchJobEnvironment(_PodEnvironment):
    """A pod of a PyTorchJob: ``RANK`` is the pod index (a node rank) beside ``PET_NNODES``; or an
    elastic PyTorchJob's pod with its ``PET_RDZV_*`` settings."""

    name = "pytorchjob"
    variables = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", *_PET_VARS)

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        if "TORCHELASTIC_RUN_ID" in environ:  # a process torchrun or ringtrain run started
            return False
        return ("PET_NNODES" in environ and "RANK" in environ) or "PET_RDZV_ENDPOINT" in environ

    @property
    def elastic(self) -> bool:
        """An elastic PyTorchJob: the rendezvous, not the operator, numbers the nodes."""
        return "RANK" not in self.environ and "PET_NODE_RANK" not in self.environ

    def nproc_per_node(self) -> int:
        """``PET_NPROC_PER_NODE``, else ``WORLD_SIZE`` / pods (the operator multiplies them)."""
        if self.environ.get("PET_NPROC_PER_NODE", "").strip() or "WORLD_SIZE" not in self.environ:
            return super().nproc_per_node()
        size, nodes = read_int(self.environ, "WORLD_SIZE"), self.nnodes()[1]
        if size < nodes or size % nodes:
            raise _Invalid(f"{self.name}: WORLD_SIZE={size} is not a multiple of PET_NNODES="
                           f"{nodes}, so the processes per pod are unknown. HINT: set "
                           "nprocPerNode in the PyTorchJob (it sets PET_NPROC_PER_NODE).")
        return size // nodes

    def pod_node_rank(self) -> int:
        if self.elastic:
            raise _Invalid(f"{self.name}: an elastic PyTorchJob pod gets its node rank "
                           f"from the rendezvous at {self.environ.get('PET_RDZV_ENDPOINT', '?')}. "
                           "HINT: run `ringtrain run python train.py` in the pod.")
        if "PET_NODE_RANK" in self.environ:
            return read_int(self.environ, "PET_NODE_RANK")
        rank = read_int(self.environ, "RANK")
        try:
            size = read_int(self.environ, "WORLD_SIZE")
        except ClusterEnvironmentError:
            return rank
        if not 0 <= rank < size:
            raise _Invalid(f"{self.name}: RANK={rank} is beyond WORLD_SIZE={size}. HINT: RANK "
                           "and WORLD_SIZE come from different jobs; unset stale values in "
                           "the pod template.")
        return rank

    def default_main_address(self) -> str:
        return self.environ.get("PET_MASTER_ADDR", "").strip() or super().default_main_address()


class JobSetEnvironment(_PodEnvironment):
    """A pod of a JobSet's Indexed Job: ``JOB_COMPLETION_INDEX`` and the coordinator's address."""

    name = "jobset"
    variables = ("JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "JOBSET_NAME", *_PET_VARS)

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return ("JOB_COMPLETION_INDEX" in environ and "RANK" not in environ
                and bool(environ.get("MASTER_ADDR") or environ.get("PET_MASTER_ADDR")))

    def pod_node_rank(self) -> int:
        return read_int(self.environ, "JOB_COMPLETION_INDEX")


class MpiJobLauncherEnvironment(OneProcessEnvironment):
    """The launcher pod of an MPIJob: one process; the workers are the hostfile's hosts."""

    name = "mpijob-launcher"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        if environ.get("K_MPI_JOB_ROLE") == "launcher":
            return True
        # mpirun's ranks inherit the hostfile variable, but also get their own OMPI_COMM_WORLD_* (detected
        # earlier); the workers' pods carry K_MPI_JOB_ROLE=worker.
        return (bool(environ.get("OMPI_MCA_orte_default_hostfile"))
                and "OMPI_COMM_WORLD_RANK" not in environ and environ.get("K_MPI_JOB_ROLE") != "worker")

    @property
    def hostfile_variable(self) -> str | None:
        """The variable naming the hostfile, or None."""
        return next((name for name in HOSTFILE_VARIABLES if self.environ.get(name)), None)

    def hosts(self) -> list[tuple[str, int]]:
        """The workers and their slots, in the hostfile's order."""
        variable = self.hostfile_variable
        if variable is None:
            raise _Invalid(f"{self.name}: no hostfile variable "
                           f"({', '.join(HOSTFILE_VARIABLES)}) is set. HINT: mount the MPIJob's "
                           "hostfile and pass --hostfile.")
        path = self.environ[variable]
        hosts = hosts_from_nodefile(path)
        if not hosts:
            raise _Invalid(f"{variable}={path}: the hostfile has no usable line (every "
                           "line is blank or a comment). HINT: the MPI Operator writes it once the "
                           "workers exist; check the MPIJob's Worker replicas.")
        return hosts

    def discovery_script(self) -> str | None:
        """The operator's host discovery script when it is mounted here."""
        variable = self.hostfile_variable
        # the operator mounts both files from one ConfigMap, so the script sits beside the hostfile
        folder = os.path.dirname(self.environ[variable] if variable else MPIJOB_DISCOVERY_SCRIPT)
        path = os.path.join(folder, os.path.basename(MPIJOB_DISCOVERY_SCRIPT))
        return path if os.access(path, os.X_OK) else None

    def source_variables(self) -> dict[str, str]:
        names = ("K_MPI_JOB_ROLE", *HOSTFILE_VARIABLES, "OMPI_MCA_orte_keep_fqdn_hostnames")
        return {k: self.environ[k] for k in names if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        try:
            hosts = self.hosts()
        except ClusterEnvironmentError as exc:
            return [*warnings, str(exc)]
        warnings.append(f"{self.name}: this is the launcher pod, one process; the {len(hosts)} worker "
                        "pod(s) of the hostfile train. HINT: run `ringtrain run python train.py` here.")
        return warnings


def kubernetes_pod(environ: Mapping[str, str]) -> ClusterEnvironment | None:
    """The operator's pod this process runs in, as its environment object; None outside one.

    For the launcher (``ringtrain run``), which asks it for node rank, nodes and processes per node
    (or the MPIJob's hosts) and never reads an operator's variable itself.
    """
    for cls in KUBERNETES_ENVIRONMENTS:
        if cls.detect(environ):
            return cls(environ)
    return None


#: Detection order among the operators, as in :data:`ringtrain.env.ENVIRONMENTS`.
KUBERNETES_ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    PyTorchJobEnvironment, TrainerV2Environment, JobSetEnvironment, MpiJobLauncherEnvironment)
