"""Where the ranks go: one node here, many hosts, or the nodes of a Slurm/PBS allocation.

Precedence: explicit torchrun node flags (``--node-rank``, ``--rdzv-endpoint``, ``--nnodes >1``), then
``-H``/``--hostfile``, then an ``srun`` step (one task per node), then a Slurm batch shell (re-launch
through ``srun``), then a PBS allocation (its node file), then this machine alone. Explicit flags and
MASTER_ADDR/MASTER_PORT win over addresses derived from an allocation.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ringtrain.env.base import port_from_job_id
from ringtrain.env.pbs import hosts_from_nodefile
from ringtrain.env.slurm import expand_nodelist, parse_tasks_per_node
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

_NON_SRUN_STEPS = frozenset({"batch", "extern", "interactive", "4294967291", "4294967292", "4294967293",
                             "4294967294", "4294967295"})


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(port: int, host: str = "") -> None:
    """Error out early, with the port in the message, when the rendezvous port is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise UsageError(f"master port {port} is already in use on this host. HINT: pick another "
                             "with --master-port, or leave it out to use a free port.") from None


def _split_endpoint(endpoint: str, default_port: int | None) -> tuple[str, int | None]:
    host, sep, port = endpoint.rpartition(":")
    if sep and port.isdigit():
        return host.strip("[]"), int(port)
    return endpoint, default_port


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


def _slurm_nodelist(environ: Mapping[str, str]) -> list[str]:
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") \
        or environ.get("SLURM_NODELIST", "")
    return expand_nodelist(nodelist) if nodelist else []


def _tasks_per_node(environ: Mapping[str, str]) -> int | None:
    text = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    try:
        counts = parse_tasks_per_node(text) if text else []
    except ClusterEnvironmentError:
        return None
    return max(counts) if counts else None


def _in_srun_step(environ: Mapping[str, str]) -> bool:
    # The batch script and interactive shells have step ids too (names, or the 0xFFFFFFFx sentinels).
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    return step is not None and step not in _NON_SRUN_STEPS and "SLURM_PROCID" in environ


def _pbs_hosts(environ: Mapping[str, str]) -> tuple[HostSlots, ...]:
    path = environ["PBS_NODEFILE"]
    try:
        entries = hosts_from_nodefile(path)
    except OSError as exc:
        raise UsageError(f"PBS_NODEFILE {path!r} cannot be read: {exc}. HINT: run inside the PBS job, or "
                         "pass the hosts with -H.") from None
    return tuple(HostSlots(host, slots) for host, slots in entries)


def resolve_plan(config: LaunchConfig, environ: Mapping[str, str]) -> Plan:
    """Decide how this ``ringtrain run`` starts its ranks."""
    # A single node's rendezvous is private, so a fresh id keeps its log folders apart; nodes that must
    # meet derive theirs from what they share.
    run_id = config.rdzv_id or uuid.uuid4().hex[:12]
    shared_run_id = config.rdzv_id or SHARED_RUN_ID
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
                        rdzv_endpoint=endpoint, run_id=shared_run_id, source="flags")
    if config.hosts:
        return HostsPlan(config.hosts, config.num_proc or sum(h.slots for h in config.hosts), "hosts")
    if "SLURM_JOB_ID" in environ and "SLURM_NNODES" in environ:
        nnodes = int(environ["SLURM_NNODES"])
        if _in_srun_step(environ):
            ntasks = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or nnodes)
            step_nodes = int(environ.get("SLURM_STEP_NUM_NODES") or nnodes)
            if ntasks != step_nodes:
                raise UsageError(f"ringtrain run was started by srun as {ntasks} tasks on {step_nodes} "
                                 "nodes; it starts the ranks of a node itself. HINT: use srun "
                                 "--ntasks-per-node=1 ringtrain run ..., or call ringtrain run from the "
                                 "batch script without srun.")
            job = environ["SLURM_JOB_ID"]
            per_node = _per_node(config, step_nodes, 1, "the Slurm step")
            if step_nodes == 1:  # one node: a free local port beats a port derived from the job id
                return NodePlan(nproc=per_node, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                                rdzv_endpoint="", run_id=run_id, local_only=True,
                                source="slurm step (one node)")
            hosts = _slurm_nodelist(environ)
            addr = config.master_addr or environ.get("MASTER_ADDR") or (hosts[0] if hosts else None)
            if addr is None:
                raise UsageError("SLURM_JOB_NODELIST is empty, so node 0 is unknown. "
                                 "HINT: pass --master-addr.")
            port = config.master_port or int(environ.get("MASTER_PORT") or port_from_job_id(job))
            return NodePlan(nproc=per_node, node_rank=int(environ.get("SLURM_NODEID", "0")),
                            min_nodes=step_nodes, max_nodes=step_nodes, rdzv_backend="static",
                            rdzv_endpoint=f"{addr}:{port}", run_id=config.rdzv_id or f"slurm-{job}",
                            source="slurm step")
        per_node = _per_node(config, nnodes, _tasks_per_node(environ) or 1, "the Slurm allocation")
        if nnodes > 1:
            return SrunPlan(nnodes=nnodes, nproc_per_node=per_node)
        return NodePlan(nproc=per_node, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                        rdzv_endpoint="", run_id=run_id, local_only=True, source="slurm (one node)")
    if environ.get("PBS_JOBID") and environ.get("PBS_NODEFILE"):
        hosts = _pbs_hosts(environ)
        return HostsPlan(hosts, config.num_proc or sum(h.slots for h in hosts), "PBS_NODEFILE")
    nproc = config.num_proc or config.nproc_per_node or 1
    return NodePlan(nproc=nproc, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                    rdzv_endpoint="", run_id=run_id, local_only=True, source="local")
