"""Where the ranks go: one node here, many hosts, or the nodes of a Slurm/PBS allocation.

Precedence: ``--standalone`` (this node alone), then explicit torchrun node flags (``--node-rank``,
``--rdzv-endpoint``, ``--nnodes >1``, also read from torchrun's ``PET_*`` variables), completed by a
Kubernetes operator's pod (a PyTorchJob's ``RANK`` or a JobSet's ``JOB_COMPLETION_INDEX`` as node rank,
processes per pod from ``WORLD_SIZE``), then ``-H``/``--hostfile``, then an MPIJob launcher's hostfile,
then an ``srun`` step (one task per node), then a Slurm batch shell (re-launch through ``srun``), then a
PBS or LSF allocation (its host file), then this machine alone. Explicit flags and
MASTER_ADDR/MASTER_PORT win over addresses derived from an allocation. What the allocation says (nodes,
node rank, tasks per node, hosts, whether this is an ``srun`` step) comes from its environment object
(:func:`ringtrain.env.allocation.scheduler_job`); this module reads no scheduler variable itself; the
same holds for the operators' pods (:func:`ringtrain.env.kubernetes.kubernetes_pod`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ringtrain.env.allocation import scheduler_job
from ringtrain.env.kubernetes import (
    JobSetEnvironment,
    MpiJobLauncherEnvironment,
    PyTorchJobEnvironment,
    kubernetes_pod,
)
from ringtrain.env.lsf import LsfEnvironment
from ringtrain.env.pbs import PbsEnvironment
from ringtrain.env.slurm import SlurmEnvironment, SlurmShellEnvironment
from ringtrain.exceptions import ClusterEnvironmentError, UsageError
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.hosts import HostSlots


@dataclass(frozen=True)
class NodePlan:
    """This process is the agent of one node of a job."""

    nproc: int
    node_rank: int
    min_nodes: int
    max_nodes: int
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str
    local_only: bool = False
    source: str = "local"


#: The run id of a multi-node rendezvous when no ``--rdzv-id`` is given: the same on every node (as
#: torchrun's fixed default), so nodes started by hand with the same endpoint always meet. One
#: rendezvous store serves one job (its port is bound once), so a fixed name cannot mix two jobs.
SHARED_RUN_ID = "ringtrain"


@dataclass(frozen=True)
class HostsPlan:
    """A driver starts one agent per host (directly here, over ssh elsewhere)."""

    hosts: tuple[HostSlots, ...]
    num_proc: int
    source: str


@dataclass(frozen=True)
class SrunPlan:
    """Inside a Slurm batch shell: run ``srun --ntasks-per-node=1 ... ringtrain run ...`` instead."""

    nnodes: int
    nproc_per_node: int


Plan = NodePlan | HostsPlan | SrunPlan

__all__ = ["SHARED_RUN_ID", "HostsPlan", "NodePlan", "Plan", "SrunPlan", "resolve_plan"]


def _per_node(config: LaunchConfig, nnodes: int, fallback: int, where: str) -> int:
    if config.nproc_per_node:
        return config.nproc_per_node
    if config.num_proc:
        if config.num_proc % nnodes:
            raise UsageError(f"-np {config.num_proc} does not divide evenly over the {nnodes} nodes of "
                             f"{where}. "
                             f"HINT: use a multiple of {nnodes}, or give --nproc-per-node.")
        return config.num_proc // nnodes
    return fallback


def _allocation_hosts(config: LaunchConfig, job: PbsEnvironment | LsfEnvironment) -> HostsPlan:
    """The hosts of a PBS or LSF job from its host file (one line per slot); ``--nproc-per-node`` wins
    over the slot counts (a job may hold more cores per node than it runs ranks)."""
    variable = job.host_file_variable or ""
    try:
        entries = job.hosts()
    except ClusterEnvironmentError as exc:  # it names the file, the line and the fix
        raise UsageError(f"{variable}: {exc}") from None
    hosts = tuple(HostSlots(host, config.nproc_per_node or slots) for host, slots in entries)
    return HostsPlan(hosts, config.num_proc or sum(h.slots for h in hosts), variable)


def _slurm_plan(config: LaunchConfig, job: SlurmEnvironment | SlurmShellEnvironment, nnodes: int,
                environ: Mapping[str, str], run_id: str) -> Plan:
    """Inside a Slurm job: one agent per node of an ``srun`` step, or re-launch through ``srun``."""
    if isinstance(job, SlurmEnvironment):
        ntasks, step_nodes = job.world_size(), job.num_nodes()
        if ntasks != step_nodes:
            raise UsageError(f"ringtrain run was started by srun as {ntasks} tasks on {step_nodes} "
                             "nodes; it starts the ranks of a node itself. HINT: use srun "
                             "--ntasks-per-node=1 ringtrain run ..., or call ringtrain run from the "
                             "batch script without srun.")
        per_node = _per_node(config, step_nodes, 1, "the Slurm step")
        if step_nodes == 1:  # one node: a free local port beats a port derived from the job id
            return NodePlan(nproc=per_node, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                            rdzv_endpoint="", run_id=run_id, local_only=True,
                            source="slurm step (one node)")
        hosts = job.step_hosts()
        addr = config.master_addr or environ.get("MASTER_ADDR") or (hosts[0] if hosts else None)
        if addr is None:
            raise UsageError("the Slurm step lists no nodes, so node 0 is unknown. "
                             "HINT: pass --master-addr.")
        port = config.master_port or int(environ.get("MASTER_PORT") or job.default_main_port())
        return NodePlan(nproc=per_node, node_rank=job.node_rank(), min_nodes=step_nodes, max_nodes=step_nodes,
                        rdzv_backend="static", rdzv_endpoint=f"{addr}:{port}",
                        run_id=config.rdzv_id or f"slurm-{job.job_id}", source="slurm step")
    per_node = _per_node(config, nnodes, job.max_tasks_per_node or 1, "the Slurm allocation")
    if nnodes > 1:
        return SrunPlan(nnodes=nnodes, nproc_per_node=per_node)
    return NodePlan(nproc=per_node, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                    rdzv_endpoint="", run_id=run_id, local_only=True, source="slurm (one node)")


def _with_pod(config: LaunchConfig, environ: Mapping[str, str]) -> tuple[LaunchConfig, str | None]:
    """``config`` completed by what a PyTorchJob's or JobSet's pod says and the flags do not.

    torchrun's ``PET_*`` variables already came in as flag defaults; what remains is the node rank a
    PyTorchJob gives as ``RANK`` (older operators set no ``PET_NODE_RANK``) or a JobSet as
    ``JOB_COMPLETION_INDEX``, and a PyTorchJob's processes per pod when only ``WORLD_SIZE`` says it.
    """
    pod = kubernetes_pod(environ)
    if not isinstance(pod, (PyTorchJobEnvironment, JobSetEnvironment)) or config.standalone:
        return config, None
    if isinstance(pod, PyTorchJobEnvironment) and pod.elastic:
        return config, "elastic pytorchjob (PET_RDZV_*)"
    try:
        changes: dict[str, object] = {}
        if config.node_rank is None:
            changes["node_rank"] = pod.pod_node_rank()
        if config.nnodes is None:
            changes["nnodes"] = pod.nnodes()
        if config.nproc_per_node is None and not config.num_proc:
            changes["nproc_per_node"] = pod.nproc_per_node()
        nodes = (changes.get("nnodes") or config.nnodes or (1, 1))[1]  # type: ignore[index]
        rank = changes.get("node_rank", config.node_rank)
        if isinstance(rank, int) and rank >= nodes:
            variable = "RANK" if isinstance(pod, PyTorchJobEnvironment) else "JOB_COMPLETION_INDEX"
            raise ClusterEnvironmentError(f"{pod.name}: {variable}={rank} is not below the {nodes} nodes of "
                                          "the job. HINT: unset stale values in the pod template.")
    except ClusterEnvironmentError as exc:  # it names the variable and the fix
        raise UsageError(str(exc)) from None
    source = f"{pod.name} pod ({', '.join(sorted(changes))} from its variables)" if changes else None
    return dataclasses.replace(config, **changes), source  # type: ignore[arg-type]


def _mpijob_hosts(config: LaunchConfig, pod: MpiJobLauncherEnvironment) -> HostsPlan:
    """An MPIJob's launcher pod: its workers from the operator's hostfile."""
    try:
        entries = pod.hosts()
    except ClusterEnvironmentError as exc:  # it names the file, the line and the fix
        raise UsageError(str(exc)) from None
    hosts = tuple(HostSlots(host, config.nproc_per_node or slots) for host, slots in entries)
    return HostsPlan(hosts, config.num_proc or sum(h.slots for h in hosts), pod.hostfile_variable or "mpijob")


def resolve_plan(config: LaunchConfig, environ: Mapping[str, str]) -> Plan:
    """Decide how this ``ringtrain run`` starts its ranks."""
    config, pod_source = _with_pod(config, environ)
    # A single node's rendezvous is private, so a fresh id keeps its log folders apart; nodes that must
    # meet derive theirs from what they share.
    run_id = config.rdzv_id or uuid.uuid4().hex[:12]
    shared_run_id = config.rdzv_id or SHARED_RUN_ID
    if config.standalone:  # torchrun's meaning: this node alone, whatever the flags or the allocation say
        return NodePlan(nproc=config.nproc_per_node or config.num_proc or 1, node_rank=0, min_nodes=1,
                        max_nodes=1, rdzv_backend="static", rdzv_endpoint="", run_id=run_id, local_only=True,
                        source="--standalone")
    multi_node_flags = config.node_rank is not None or config.rdzv_endpoint is not None \
        or (config.nnodes is not None and config.nnodes[1] > 1)
    if multi_node_flags:
        min_nodes, max_nodes = config.nnodes or (1, 1)
        backend = config.rdzv_backend or ("static" if min_nodes == max_nodes else "c10d")
        if backend == "static" and min_nodes != max_nodes:
            raise UsageError(f"--nnodes {min_nodes}:{max_nodes} needs an elastic rendezvous. HINT: add "
                             "--rdzv-backend c10d, or give a fixed --nnodes.")
        endpoint = config.rdzv_endpoint
        if endpoint is None:
            addr = config.master_addr or environ.get("MASTER_ADDR")
            port = config.master_port or int(environ.get("MASTER_PORT", "29500"))
            if addr is None:
                raise UsageError("a multi-node run needs the address of node 0. HINT: pass "
                                 "--rdzv-endpoint HOST:PORT or --master-addr HOST --master-port PORT.")
            endpoint = f"{addr}:{port}"
        if (config.node_rank or 0) >= max_nodes:
            raise UsageError(f"--node-rank {config.node_rank} is not below --nnodes {max_nodes}. "
                             f"HINT: node ranks run from 0 to {max_nodes - 1}.")
        return NodePlan(nproc=_per_node(config, max_nodes, 1, "--nnodes"), node_rank=config.node_rank or 0,
                        min_nodes=min_nodes, max_nodes=max_nodes, rdzv_backend=backend,
                        rdzv_endpoint=endpoint, run_id=shared_run_id, source=pod_source or "flags")
    if config.hosts:
        return HostsPlan(config.hosts, config.num_proc or sum(h.slots for h in config.hosts), "hosts")
    pod = kubernetes_pod(environ)
    if isinstance(pod, MpiJobLauncherEnvironment):
        return _mpijob_hosts(config, pod)
    job = scheduler_job(environ)
    if isinstance(job, (SlurmEnvironment, SlurmShellEnvironment)):
        try:
            if job.job_nodes is not None:
                return _slurm_plan(config, job, job.job_nodes, environ, run_id)
        except ClusterEnvironmentError as exc:  # a variable that is not a number: it names it and the fix
            raise UsageError(str(exc)) from None
    elif isinstance(job, (PbsEnvironment, LsfEnvironment)) and job.host_file_variable:
        return _allocation_hosts(config, job)
    nproc = config.num_proc or config.nproc_per_node or 1
    return NodePlan(nproc=nproc, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                    rdzv_endpoint="", run_id=run_id, local_only=True, source="local")
