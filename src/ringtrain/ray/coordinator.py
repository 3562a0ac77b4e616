"""The rendezvous of workers that Ray Train numbered: Horovod's ``Coordinator``, on ringtrain's job store.

Ray Train (Train V1's ``HorovodTrainer``, ``ray/train/horovod/config.py``) starts its own worker actors,
numbers them, and then asks ``horovod.ray.runner.Coordinator`` three things, in this order:

1. ``register(hostname, node_id, world_rank)`` for every worker;
2. ``finalize_registration()``: each rank's variables, which Ray sets in that rank's worker;
3. ``establish_rendezvous()``: the variables every worker gets, the rendezvous's address among them.

Here the places (local rank, cross rank and size) follow :func:`ringtrain.ray.ranks.places_of_ranks`
and the variables are those :class:`~ringtrain.ray.RayExecutor` gives its actors
(:mod:`ringtrain.engine.rank_env`); the rendezvous is a ringtrain job store that this process (Ray
Train's trainer actor) hosts under a fresh secret, so ``hvd.init()`` in the workers joins it as in any
ringtrain job. The secret goes to the workers among the variables of step 3: Ray Train sets them through a
task of its own, whose arguments stay inside the Ray cluster (never a command line, never printed).

:func:`detect_nics` and :func:`nics_to_env_var` are ``horovod.ray.utils``' two helpers with ringtrain's
meaning: the interfaces given, as ``GLOO_SOCKET_IFNAME``; none given, the ranks route to the job store.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from ringtrain.engine import auth, job_store
from ringtrain.engine.rank_env import place_variables, store_variables
from ringtrain.ray import cluster
from ringtrain.ray.ranks import RankPlace, WorkerNode, places_of_ranks

#: ``hvd.init()``'s timeout when the settings carry none (Ray's HorovodConfig's default).
DEFAULT_TIMEOUT_S = 300.0


def open_job_store(node_ips: Iterable[str]) -> tuple[job_store.JobStoreServer, str, str]:
    """A job store in this process for ranks on the Ray nodes ``node_ips``: (server, address, secret)."""
    host = cluster.store_host(node_ips)
    secret = job_store.new_secret()
    server = job_store.JobStoreServer(secret, host=host, port=0)
    return server, job_store.join_address(host, server.port), secret


def place_environ(place: RankPlace) -> dict[str, str]:
    """The variables of one rank's place (those of :func:`ringtrain.ray.ranks.worker_environ` but the
    job store's)."""
    return place_variables(rank=place.rank, size=place.size, local_rank=place.local_rank,
                           local_size=place.local_size, node_rank=place.node_rank,
                           cross_rank=place.cross_rank, cross_size=place.cross_size,
                           hostname=place.node.hostname)


class Coordinator:
    """Horovod's ``horovod.ray.runner.Coordinator``: registers Ray Train's workers, hosts their rendezvous.

    ``settings``: anything with ``timeout_s`` (Ray's ``HorovodConfig``); it becomes the ranks'
    ``hvd.init()`` timeout. Its ``key`` is not used: each rendezvous makes a fresh ringtrain secret.
    """

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._nodes: dict[int, WorkerNode] = {}
        self._hostnames: set[str] = set()
        self._places: list[RankPlace] = []
        self._server: job_store.JobStoreServer | None = None
        self._closer: weakref.finalize | None = None

    @property
    def hostnames(self) -> set[str]:
        """The host names registered (one per node, as Horovod's Coordinator had them)."""
        return self._hostnames

    @property
    def world_size(self) -> int:
        """The number of workers registered."""
        return len(self._nodes)

    @property
    def node_id_string(self) -> str:
        """``node_id:workers`` per node, comma-separated (Horovod's host string, over node ids)."""
        counts: dict[str, int] = {}
        for rank in sorted(self._nodes):
            counts[self._nodes[rank].node_id] = counts.get(self._nodes[rank].node_id, 0) + 1
        return ",".join(f"{node}:{count}" for node, count in counts.items())

    def register(self, hostname: str, node_id: str, world_rank: int) -> None:
        """Worker ``world_rank`` runs on Ray node ``node_id`` of host ``hostname``."""
        if isinstance(world_rank, bool) or not isinstance(world_rank, int) or world_rank < 0:
            raise ValueError(f"world_rank={world_rank!r} must be a whole number of at least 0.")
        if world_rank in self._nodes:
            raise ValueError(f"world_rank={world_rank} is registered twice (on "
                             f"{self._nodes[world_rank].hostname} and {hostname}). HINT: register each "
                             "worker once.")
        self._hostnames.add(hostname)
        # the node's IP is looked up at the rendezvous: Ray Train registers by node id and host name
        self._nodes[world_rank] = WorkerNode(node_id=node_id, node_ip="", hostname=hostname)

    def finalize_registration(self) -> dict[int, dict[str, str]]:
        """Each rank's variables (rank, local and cross rank and size, host), by rank."""
        missing = sorted(set(range(len(self._nodes))) - set(self._nodes))
        if not self._nodes or missing:
            raise ValueError(f"the registered ranks {sorted(self._nodes)} are not 0..N-1 (missing: "
                             f"{missing}). HINT: register every worker of the job, with world ranks from 0.")
        self._places = places_of_ranks([self._nodes[rank] for rank in range(len(self._nodes))])
        return {place.rank: place_environ(place) for place in self._places}

    def establish_rendezvous(self) -> dict[str, str]:
        """Open the job's store here; the variables every worker needs to join it (the secret included)."""
        if not self._places:
            raise RuntimeError("establish_rendezvous() before finalize_registration(). HINT: register every "
                               "worker, then call finalize_registration() first.")
        self.close()
        addresses = cluster.node_addresses()
        unknown = sorted({p.node.node_id for p in self._places} - set(addresses))
        if unknown:
            raise RuntimeError(f"Ray node(s) {', '.join(n[:12] for n in unknown)} of the registered workers "
                               "are not alive in the cluster. HINT: a node was lost while the job started; "
                               "start again.")
        self._server, address, secret = open_job_store(addresses[p.node.node_id] for p in self._places)
        # a Coordinator that Ray Train replaces (a restart after a failure) closes its store when dropped
        self._closer = weakref.finalize(self, self._server.close)
        timeout_s = getattr(self.settings, "timeout_s", None) or DEFAULT_TIMEOUT_S
        return {**store_variables(store_address=address, gloo_timeout_s=timeout_s), auth.ENV_SECRET: secret}

    def close(self) -> None:
        """Close the job store (the workers' ``hvd.init()`` cannot join any more)."""
        if self._closer is not None:
            self._closer()
            self._closer = None
        self._server = None


def detect_nics(settings: Any, all_host_names: Iterable[str] | None = None,
                node_workers: Iterable[Any] | None = None) -> set[str] | None:
    """The interfaces the ranks use among themselves: ``settings.nics`` when given, else None (each rank
    routes to the job store's address; nothing is probed, unlike Horovod's version)."""
    nics = getattr(settings, "nics", None)
    if not nics:
        return None
    names = nics.split(",") if isinstance(nics, str) else list(nics)
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"nics={nics!r} must name network interfaces, e.g. {{'eth0'}}. HINT: leave it "
                         "out to let the ranks pick the route to the job store.")
    return {n.strip() for n in names}


def nics_to_env_var(nics: Iterable[str] | None) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` for ``nics`` (as :class:`~ringtrain.ray.RayExecutor` sets it); none: {}."""
    names = sorted(nics or ())
    return {"GLOO_SOCKET_IFNAME": ",".join(names)} if names else {}
