"""``ringtrain run --ray [ADDRESS] --min-np N --max-np M``: the elastic driver over a Ray cluster's nodes.

The elastic driver (:mod:`ringtrain.launch.elastic_driver`) re-forms a job over a changing set of
hosts; here that set is the Ray cluster's living nodes and a worker starts in a Ray actor instead of
over ssh. :class:`RayHosts` is the elastic driver's backend for it (:class:`ringtrain.launch.backend.Backend`,
chosen by ``select_backend`` for ``--ray``), in two halves:

- the discovery: every second, the nodes ``ray.nodes()`` counts alive, each with as many slots as
  its *total* CPUs (and GPUs, with ``--ray-gpus-per-rank``) hold ranks of ``--ray-cpus-per-rank``
  (Horovod's Ray discovery counts the same way), the driver's own node first (so rank 0 starts there,
  beside the job store), the others in Ray's order. A host is named by its node's IP address (host
  names may repeat across nodes; an address may not among living nodes). A node where one of this
  job's actors was lost is left out for the rest of the job: Ray may count a node that just died
  alive for many seconds, and a node that comes back joins under a new node id, which is used again.
- the place: one :class:`~ringtrain.launch.ray.actor.NodeAgentActor` per worker, pinned to its node
  (hard node affinity), running ``python -m ringtrain.launch.elastic_worker COMMAND`` as its child,
  supervised from here by a :class:`~ringtrain.launch.ray.group.RayGroup` (output relay, heartbeats,
  stop and kill), with the job's secret on the worker's stdin as over ssh.

Everything else (generations, state restore through ``hvd.elastic.run``, the blacklist, the
``--elastic-timeout`` and ``--reset-limit`` bounds, the root-cause report) is the elastic driver's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ringtrain.launch import link
from ringtrain.launch.backend import WorkerStart, log, remote_environment
from ringtrain.launch.elastic_hosts import DiscoveryError
from ringtrain.launch.hosts import is_local_host
from ringtrain.launch.ray.actor import agent_actor
from ringtrain.launch.ray.group import RayGroup
from ringtrain.launch.supervision import Reach

#: Slack for CPU counts that are fractions (0.1 + 0.2 CPUs a rank must still count 3 ranks in 0.9).
_EPSILON = 1e-9


class RayHosts:
    """The Ray cluster as an elastic job's hosts: discovery (:meth:`find`) and place (:meth:`start`).

    ``cpus_per_rank`` / ``gpus_per_rank``: what each worker's actor reserves (and what a slot is).
    ``start_timeout``: seconds a worker's actor may take to start on its node before the worker counts
    as one that could not start there (the node full, or gone).
    """

    def __init__(self, cpus_per_rank: float, gpus_per_rank: float, start_timeout: float) -> None:
        if not cpus_per_rank > 0:
            raise ValueError(f"cpus_per_rank={cpus_per_rank!r} must be positive. HINT: e.g. 1.")
        self.cpus_per_rank = float(cpus_per_rank)
        self.gpus_per_rank = float(gpus_per_rank or 0)
        self.start_timeout = float(start_timeout)
        self._lock = threading.Lock()
        #: host (node IP) -> the node, as NodeAgentActor.where() says it, from the last discovery.
        self._nodes: dict[str, dict[str, str]] = {}
        self._groups: list[RayGroup] = []
        self._secret_ref: Any = None

    # --- discovery -------------------------------------------------------------------------------
    def describe(self) -> str:
        gpus = f" and {self.gpus_per_rank:g} GPU(s)" if self.gpus_per_rank else ""
        return f"the Ray cluster's living nodes ({self.cpus_per_rank:g} CPU(s){gpus} a slot)"

    def slots_of(self, resources: Mapping[str, float]) -> int:
        """How many ranks fit in a node's total ``resources``."""
        slots = int(float(resources.get("CPU", 0)) / self.cpus_per_rank + _EPSILON)
        if self.gpus_per_rank:
            slots = min(slots, int(float(resources.get("GPU", 0)) / self.gpus_per_rank + _EPSILON))
        return slots

    def find(self) -> dict[str, int]:
        """``{node IP: slots}`` of the living nodes (see the module doc)."""
        import ray

        try:
            listing = ray.nodes()
        except Exception as exc:  # Ray's errors of a cluster that went away, in one line
            raise DiscoveryError(f"the Ray cluster did not answer ray.nodes(): {type(exc).__name__}: "
                                 f"{(str(exc).strip().splitlines() or [''])[0]}") from None
        with self._lock:
            lost = {g.node.get("node_id") for g in self._groups if g.lost is not None}
        found: dict[str, int] = {}
        nodes: dict[str, dict[str, str]] = {}
        for node in listing:
            if not node.get("Alive") or node.get("NodeID") in lost:
                continue
            slots = self.slots_of(node.get("Resources") or {})
            address = str(node.get("NodeManagerAddress") or "")
            if slots < 1 or not address or address in found:
                continue
            found[address] = slots
            nodes[address] = {"node_id": str(node["NodeID"]), "node_ip": address,
                              "hostname": str(node.get("NodeManagerHostname") or address)}
        with self._lock:
            self._nodes = nodes
        # The driver's own node first (rank 0 there, beside the job store), then Ray's order.
        return dict(sorted(found.items(), key=lambda item: not is_local_host(item[0])))

    # --- the backend's side of the elastic driver (launch/backend.py) ------------------------------
    def listens_beyond_loopback(self) -> bool:
        return True  # the workers run on the Ray nodes

    def beat_interval(self, peer_timeout: float) -> float:
        # an actor call each way per beat: beats as sparse as the silence limit allows
        return link.sparse_beat_interval(peer_timeout)

    def start_worker(self, start: WorkerStart) -> RayGroup:
        """As over ssh: the launcher's variables travel, the secret goes on the worker's stdin."""
        env = remote_environment(start, {link.ENV_BEAT_INTERVAL: f"{start.beat_interval:g}"})
        group = self.start(start.host, start.argv, env, start.secret, start.rank, start.lock)
        if start.verbose:
            log(f"worker {start.wid} on Ray node {start.host}: agent pid {group.pid}")
        return group

    def not_started_text(self, wid: str, group: Any) -> str:
        return str(group.describe_end(f"worker {wid}"))  # the actor's story

    def hosts_changed(self, group: Any) -> bool:
        # a lost Ray node: the discovery leaves out nodes whose actors were lost, so it is gone now
        return bool(group.lost_contact())

    # --- place -----------------------------------------------------------------------------------
    def start(self, host: str, argv: Sequence[str], env: Mapping[str, str], secret: str, rank: int,
              lock: threading.Lock, cwd: str | None = None) -> RayGroup:
        """Start ``argv`` in a new actor on the node named ``host``; the secret goes on its stdin."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._free_ended()
        with self._lock:
            node = self._nodes.get(host)
        if node is None:  # gone between the discovery and this start: a worker that cannot start here
            node = {"node_id": "", "node_ip": host, "hostname": host}
        if self._secret_ref is None:
            self._secret_ref = ray.put(secret)
        actor = agent_actor(self.cpus_per_rank, self.gpus_per_rank,
                            NodeAffinitySchedulingStrategy(node_id=node["node_id"], soft=False)
                            if node["node_id"] else None).remote()
        group = RayGroup(host, argv, env, actor=actor, node=node, ranks=range(rank, rank + 1),
                         secret_ref=self._secret_ref, lock=lock, reach=Reach(cwd=cwd),
                         start_timeout=self.start_timeout)
        with self._lock:
            self._groups.append(group)
        return group

    def _free_ended(self) -> None:
        """Kill the actors of workers that ended: each holds its CPUs until then, which a worker
        started in its place may need."""
        import ray

        with self._lock:
            ended = [g for g in self._groups if g.poll() is not None and not g.freed]
            for group in ended:
                group.freed = True
        for group in ended:
            try:
                ray.kill(group.actor)
            except Exception:  # an actor whose node is gone is not there to kill
                pass

    def release(self) -> None:
        """Kill every actor this job started (their nodes may be gone already)."""
        import ray

        with self._lock:
            groups, self._groups = self._groups, []
        for group in groups:
            try:
                ray.kill(group.actor)
            except Exception:  # an actor whose node is gone is not there to kill
                pass


__all__ = ["RayHosts"]
