"""Numbering the workers: ranks grouped by Ray node, and the environment each rank gets.

Pure functions (no Ray calls), so that the rank arithmetic is tested on its own.

Nodes are ordered by how many workers they hold, most first (ties: the order the workers were
created in), and numbered by :mod:`ringtrain.engine.placement`, so a worker's Horovod cross rank is
its node's index: right on uneven placements (``PACK``) too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringtrain.engine.placement import busiest_first, places_by_node
from ringtrain.engine.rank_env import rank_variables


@dataclass(frozen=True)
class WorkerNode:
    """Where one worker actor landed (as the actor itself reports it)."""

    node_id: str
    node_ip: str
    hostname: str


@dataclass(frozen=True)
class RankPlace:
    """One worker's place in the job."""

    worker: int  # index of the actor in creation order
    rank: int
    size: int
    local_rank: int
    local_size: int
    node_rank: int
    cross_rank: int
    cross_size: int
    node: WorkerNode


def assign_ranks(nodes: Sequence[WorkerNode]) -> list[RankPlace]:
    """Ranks for workers created in order, ``nodes[i]`` being where worker ``i`` runs; in rank order."""
    return _places(nodes, renumber=True)


def places_of_ranks(nodes: Sequence[WorkerNode]) -> list[RankPlace]:
    """The places of workers numbered already, ``nodes[r]`` being where rank ``r`` runs (Ray Train numbers
    its workers itself): local ranks count a node's workers in rank order, nodes are ordered as in
    :func:`assign_ranks`, so the cross rank is again the node's index. In rank order."""
    return sorted(_places(nodes, renumber=False), key=lambda place: place.rank)


def _places(nodes: Sequence[WorkerNode], renumber: bool) -> list[RankPlace]:
    return [RankPlace(worker=p.member, rank=p.rank if renumber else p.member, size=len(nodes),
                      local_rank=p.local_rank, local_size=p.local_size, node_rank=p.node_rank,
                      cross_rank=p.cross_rank, cross_size=p.cross_size, node=nodes[p.member])
            for p in places_by_node(busiest_first([node.node_id for node in nodes]))]


def worker_environ(place: RankPlace, store_address: str, gloo_timeout_s: float,
                   nics: Sequence[str] | None = None,
                   extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables ``hvd.init()`` reads in the actor of ``place`` (the job's secret travels apart).

    torch's env:// names (what ``ringtrain run`` gives its ranks) plus Horovod's, pointing at the job
    store the driver hosts. ``GROUP_WORLD_SIZE`` is left out on purpose: without it the cross size is
    read from ``CROSS_SIZE``, which is per local rank. ``extra`` (the user's ``extra_env_vars``) is
    applied last, so it may override any of them.
    """
    env = rank_variables(rank=place.rank, size=place.size, local_rank=place.local_rank,
                         local_size=place.local_size, node_rank=place.node_rank, cross_rank=place.cross_rank,
                         cross_size=place.cross_size, hostname=place.node.hostname,
                         store_address=store_address, gloo_timeout_s=gloo_timeout_s)
    if nics:
        env["GLOO_SOCKET_IFNAME"] = ",".join(nics)
    for key, value in (extra or {}).items():
        env[str(key)] = str(value)
    return env

