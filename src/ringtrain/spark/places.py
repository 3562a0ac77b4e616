"""Numbering the tasks of a barrier stage: ranks grouped by executor host, and each rank's variables.

Pure functions (no Spark calls), so the arithmetic is tested on its own. Every task computes the
whole table from the same input, ``BarrierTaskContext.getTaskInfos()`` (one ``host:port`` address per
task, in partition order), so all tasks agree on it without talking to each other.

Hosts are ordered by how many tasks they hold, most first (ties: the host of the lowest partition),
and numbered by :mod:`ringtrain.engine.placement`, so a task's Horovod cross rank is its host's
index, right on uneven placements too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringtrain.engine.placement import busiest_first, places_by_node
from ringtrain.engine.rank_env import rank_variables


@dataclass(frozen=True)
class TaskPlace:
    """One task's place in the job."""

    partition: int
    host: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def host_of(address: str) -> str:
    """The host part of a task address (``host:port``, ``[v6]:port``, or a bare host)."""
    address = address.strip()
    if address.startswith("["):
        return address[1:address.index("]")]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or ":" in host:
        return address  # a bare host, or an IPv6 address without a port
    return host


def assign_places(addresses: Sequence[str]) -> list[TaskPlace]:
    """The place of every task, ``addresses[i]`` being where partition ``i`` runs; in partition order."""
    hosts = [host_of(address) for address in addresses]
    places = [TaskPlace(partition=p.member, host=hosts[p.member], rank=p.rank, size=len(addresses),
                        local_rank=p.local_rank, local_size=p.local_size, cross_rank=p.cross_rank,
                        cross_size=p.cross_size)
              for p in places_by_node(busiest_first(hosts))]
    return sorted(places, key=lambda p: p.partition)


def rank_environ(place: TaskPlace, store_address: str, gloo_timeout_s: float, attempt: int = 0,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables ``hvd.init()`` reads in the process of ``place`` (the job's secret travels apart).

    torch's env:// names plus Horovod's, pointing at the job store the driver hosts, as the Ray
    executor gives its actors. ``GROUP_WORLD_SIZE`` is left out on purpose: without it the cross size
    is read from ``CROSS_SIZE``, which is per local rank. ``RINGTRAIN_ATTEMPT`` is the stage attempt, so
    a retried stage never reads the keys of the attempt before it. ``extra`` (the caller's ``env``) is
    applied first, so it cannot break the job's own names.
    """
    env = {str(k): str(v) for k, v in (extra or {}).items()}
    env.update(rank_variables(rank=place.rank, size=place.size, local_rank=place.local_rank,
                              local_size=place.local_size, node_rank=place.cross_rank,
                              cross_rank=place.cross_rank, cross_size=place.cross_size, hostname=place.host,
                              store_address=store_address, gloo_timeout_s=gloo_timeout_s))
    env["RINGTRAIN_ATTEMPT"] = str(attempt)
    return env

