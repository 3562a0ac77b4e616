"""``ringtrain run --ray [ADDRESS]``: any ringtrain job on a Ray cluster, one node agent per Ray node.

What it does, in order: join the cluster (:func:`ringtrain.ray.cluster.connect`: an address nobody
answers on fails within ``--start-timeout``); reserve a placement group, one bundle per rank
(``PACK``) or, with ``--nproc-per-node K``, one bundle of K ranks per node (``STRICT_SPREAD``),
each bundle ``--ray-cpus-per-rank`` CPUs and ``--ray-gpus-per-rank`` GPUs per rank (a group the
cluster cannot fit fails after ``--ray-placement-timeout`` naming what was asked and what the cluster
has); put one :class:`~ringtrain.launch.ray.group.NodeAgentActor` in every bundle, to learn which
node each bundle went to; end all but the first actor of each node, which starts that node's agent
behind a bridge (:mod:`ringtrain.launch.ray.bridge`) that connects back to this driver, and ends too
(the placement group holds every bundle's CPUs and GPUs until the job ends). From there the job is a
multi-host job like the ssh one (:class:`ringtrain.launch.driver.HostsJob`, each node a
:class:`~ringtrain.launch.ray.bridged_group.BridgedRayGroup`): the same rendezvous on node 0 (the
driver's own Ray node where it got ranks), the same relay with rank prefixes, the same root-cause
report and ``--max-restarts``. A Ray node that is lost ends the job, its node and ranks named.

With ``--min-np``/``--max-np`` the job is elastic instead (:mod:`ringtrain.launch.ray.elastic`): no
placement group; the elastic driver starts one actor per worker on the cluster's living nodes and
re-forms the job when a node goes or comes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ringtrain.engine import auth
from ringtrain.exceptions import UsageError
from ringtrain.launch import store_host
from ringtrain.launch.config import LaunchConfig, exported_values
from ringtrain.launch.driver import HostsJob, check_command, node_argv, node_config, prepare
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.plan import HostsPlan
from ringtrain.launch.prechecks import require_ray
from ringtrain.launch.ray import bridge as ray_bridge
from ringtrain.launch.ray.actor import agent_actor
from ringtrain.launch.ray.bridged_group import BridgedRayGroup
from ringtrain.launch.ray.group import RayGroup
from ringtrain.launch.remote import forwarded_environment
from ringtrain.launch.report import RankFailure


@dataclass
class RayNode:
    """One Ray node of the job: where it is, its ranks, and the actor that runs its agent."""

    node: dict[str, str]
    actors: list[Any]
    slots: int
    gpu_ids: list[str]


@dataclass
class Placement:
    """The job's room on the cluster: the placement group, every actor in it, and the nodes."""

    reservation: Any  # ringtrain.ray.cluster.Reservation
    actors: list[Any]
    nodes: list[RayNode]

    def release(self) -> None:
        """Kill the actors and remove the placement group (the cluster may be gone already)."""
        import ray

        from ringtrain.ray import cluster

        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # an actor whose node is gone is not there to kill
                pass
        cluster.release(self.reservation)


def launch_on_ray(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Run ``config`` on the Ray cluster it names; returns the launcher's exit code."""
    environ = dict(os.environ if environ is None else environ)
    require_ray()
    prepare(config, environ)
    check_command(config.command, config.no_python)
    from ringtrain.ray import cluster

    address = config.ray if config.ray not in (None, "", "auto") else \
        (environ.get(cluster.ADDRESS_VARIABLE) or "auto")
    try:
        cluster.connect(address, config.start_timeout, timeout_hint="raise --start-timeout", quiet=True)
    except (ConnectionError, ValueError) as exc:
        where = "on this machine (no RAY_ADDRESS)" if address == "auto" else f"at {address}"
        text = str(exc) if "HINT" in str(exc) else (
            f"no Ray cluster {where}: {str(exc).strip().rstrip('.')}. HINT: start one with `ray start "
            "--head`, or give its address: --ray HOST:PORT (or RAY_ADDRESS).")
        print(f"ringtrain run: error: {text}", file=sys.stderr, flush=True)
        # nothing started: the cluster (or its address or token) is for the user to fix, as a bad flag is
        return 2
    if config.elastic:
        # the elastic driver on the backend --ray selects (launch/backend.py: RayHosts)
        from ringtrain.launch.elastic_driver import launch_elastic

        return launch_elastic(config, environ)
    try:
        placement = place(config)
    except cluster.PlacementTimeoutError as exc:
        print(f"ringtrain run: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except UsageError:
        raise
    except Exception as exc:  # Ray's errors of actors that did not come up, said in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        print(f"ringtrain run: error: the node agents' actors did not start on the Ray cluster "
              f"({type(exc).__name__}: {first}). HINT: install the same ringtrain (and torch) on every Ray "
              "node, in the Python the cluster runs; see Ray's logs of the node named above.",
              file=sys.stderr, flush=True)
        return 1
    try:
        return RayJob(config, environ, placement).run()
    except (TimeoutError, ConnectionError) as exc:  # a node's bridge that did not connect back (said why)
        print(f"ringtrain run: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        placement.release()


def place(config: LaunchConfig) -> Placement:
    """Reserve the ranks' room and start an actor in every bundle; the nodes in node-rank order (node
    0 is the driver's Ray node where it got ranks, else the node of bundle 0)."""
    import ray

    from ringtrain.ray import cluster

    num_proc = config.num_proc or config.nproc_per_node or 1
    per_bundle = config.nproc_per_node or 1
    if num_proc % per_bundle:
        raise UsageError(f"-np {num_proc} does not divide into nodes of --nproc-per-node {per_bundle}. "
                         f"HINT: give a multiple of {per_bundle}.")
    bundles = num_proc // per_bundle
    resources = {"CPU": config.ray_cpus_per_rank * per_bundle, "GPU": config.ray_gpus_per_rank * per_bundle}
    strategy = "STRICT_SPREAD" if config.nproc_per_node else "PACK"
    reservation = cluster.reserve(resources, bundles, strategy, 1, config.ray_placement_timeout,
                                  use_current=False, timeout_hint="raise --ray-placement-timeout")
    actors = [agent_actor(resources["CPU"], resources["GPU"], in_bundle(reservation.group, index)).remote()
              for index in range(bundles)]
    try:
        wheres = ray.get([a.where.remote() for a in actors], timeout=max(config.start_timeout, 60.0))
        gpus = ray.get([a.gpu_ids.remote() for a in actors], timeout=max(config.start_timeout, 60.0)) \
            if config.ray_gpus_per_rank else [[] for _ in actors]
    except BaseException:
        Placement(reservation, actors, []).release()
        raise
    nodes: dict[str, RayNode] = {}
    for actor, where, ids in zip(actors, wheres, gpus):
        node = nodes.setdefault(where["node_id"], RayNode(node=where, actors=[], slots=0, gpu_ids=[]))
        node.actors.append(actor)
        node.slots += per_bundle
        node.gpu_ids += [g for g in ids if g not in node.gpu_ids]
    # The placement group keeps every bundle's CPUs and GPUs reserved until it is removed: of a node's
    # actors only the one that runs its agent stays. Each other one is a Ray worker process whose
    # background threads cost CPU that the ranks beside it would lose, for the whole job.
    for node in nodes.values():
        for spare in node.actors[1:]:
            with contextlib.suppress(Exception):  # an actor already gone holds nothing
                ray.kill(spare)
        del node.actors[1:]
    ordered = driver_node_first(list(nodes.values()), ray.get_runtime_context().get_node_id())
    return Placement(reservation, [node.actors[0] for node in ordered], ordered)


def driver_node_first(nodes: list[RayNode], driver_node_id: str) -> list[RayNode]:
    """``nodes`` with the driver's own Ray node first where it holds ranks: node 0 holds the job's
    rendezvous and rank 0, beside the driver, as with ``ringtrain run -H`` started on its first host
    (the other nodes keep their order)."""
    return sorted(nodes, key=lambda node: node.node.get("node_id") != driver_node_id)


def in_bundle(group: Any, index: int) -> Any:
    """Ray's scheduling strategy for an actor in bundle ``index`` of ``group``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


class RayJob(HostsJob):
    """A :class:`~ringtrain.launch.driver.HostsJob` whose agents run in Ray actors."""

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str], placement: Placement) -> None:
        self.placement = placement
        names = [n.node["hostname"] for n in placement.nodes]
        if len(set(names)) < len(names):  # nodes that share a host name are told apart by address
            names = [n.node["node_ip"] for n in placement.nodes]
        nodes = [HostSlots(name, n.slots) for name, n in zip(names, placement.nodes)]
        plan = HostsPlan(tuple(nodes), sum(n.slots for n in nodes), "ray")
        super().__init__(config, plan, environ, nodes, [False] * len(nodes))

    def start_agents(self) -> None:
        import ray

        from ringtrain.ray import cluster

        config, nodes, placed = self.config, self.nodes, self.placement.nodes
        first = placed[0]
        port = config.master_port or int(ray.get(first.actors[0].free_port.remote()))
        endpoint = f"{config.master_addr or first.node['node_ip']}:{port}"
        run_id = config.rdzv_id or uuid.uuid4().hex[:12]
        secret_ref = ray.put(store_host.node_secret(self.environ, whole_job_here=True) or "")
        # each node's bridge proves this token when it connects back (auth.new_secret: 256 random bits)
        token = auth.new_secret()
        token_ref = ray.put(token)
        listen_host = cluster.driver_address([where.node["node_ip"] for where in placed])
        slots, hosts = [n.slots for n in nodes], [n.host for n in nodes]
        # as the ssh place: the launcher's knobs and -x NAME values travel in the agent's environment
        forwarded = forwarded_environment(self.environ, exported_values(config, self.environ))
        start = 0
        for k, (node, where) in enumerate(zip(nodes, placed)):
            agent_config = replace(node_config(config, k, len(nodes), node.slots, endpoint, run_id, slots,
                                               hosts), ray=None)
            env = dict(forwarded)
            if where.gpu_ids:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(where.gpu_ids)
            agent = BridgedRayGroup(node.host, node_argv(agent_config), env, actor=where.actors[0],
                                    node=where.node, ranks=range(start, start + node.slots), index=k,
                                    listen_host=listen_host, token=token, token_ref=token_ref,
                                    secret_ref=secret_ref, lock=self.lock, on_error_line=self._take_marker,
                                    connect_timeout=max(config.start_timeout, ray_bridge.CONNECT_TIMEOUT_S))
            if config.verbose:
                print(f"ringtrain run: node {k} on Ray node {where.node['node_ip']} ({node.host}): ranks "
                      f"{start}-{start + node.slots - 1}, agent pid {agent.pid}", file=sys.stderr, flush=True)
            self.agents.append(agent)
            start += node.slots

    def outcome(self) -> int:
        # A node lost while the job was stopping for another failure (the ranks elsewhere may notice
        # first) is still part of the story, and often its start.
        for k, agent in enumerate(self.agents):
            if isinstance(agent, RayGroup) and agent.lost is not None:
                self.ended_early.setdefault(k, agent.last_heard)
        return super().outcome()

    def lost(self, k: int) -> RankFailure:
        """A node whose actor died went before the driver last heard from it: that time orders it among
        the ranks' failures (the ranks on other nodes fail after it, having lost their peers)."""
        found = super().lost(k)
        agent = self.agents[k]
        if isinstance(agent, RayGroup) and agent.lost is not None:
            found = replace(found, time=min(found.time, agent.last_heard), state="unreachable")
        return found
