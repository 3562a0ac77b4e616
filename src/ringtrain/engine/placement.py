"""Numbering ranks that are grouped by node: the one algorithm behind ``ringtrain run``'s host slots,
the Ray executor's actors and the Spark runner's tasks.

Pure functions. A node's members get consecutive ranks, node after node; a member's local rank is its
index on its node. Horovod's cross rank of a member is its node's index among the nodes that hold a
member of the same local rank, and the cross size is how many such nodes there are, so uneven nodes
(3 ranks on one, 1 on another) are numbered right too.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Place:
    """One member's place: ``member`` is the caller's own index of it (actor, task, slot)."""

    member: int
    rank: int
    local_rank: int
    local_size: int
    node_rank: int
    cross_rank: int
    cross_size: int


def places_by_node(nodes: Sequence[Sequence[int]]) -> list[Place]:
    """The places of the members of ``nodes`` (each node's members, nodes in node-rank order); in rank
    order."""
    counts = [len(members) for members in nodes]
    # the nodes holding local rank r, in node order, and each one's index among them
    holders: dict[int, dict[int, int]] = {}
    for local_rank in range(max(counts, default=0)):
        holding = [node for node, count in enumerate(counts) if count > local_rank]
        holders[local_rank] = {node: index for index, node in enumerate(holding)}
    places: list[Place] = []
    for node_rank, members in enumerate(nodes):
        for local_rank, member in enumerate(members):
            places.append(Place(member=member, rank=len(places), local_rank=local_rank,
                                local_size=len(members), node_rank=node_rank,
                                cross_rank=holders[local_rank][node_rank],
                                cross_size=len(holders[local_rank])))
    return places


def busiest_first(keys: Sequence[Hashable]) -> list[list[int]]:
    """The indexes of ``keys`` grouped by key (``keys[i]``: the node of member ``i``), the nodes ordered
    by how many members they hold, most first (ties: the node of the lowest index).

    In that order the nodes that hold local rank ``r`` are always the first ones, so each member's cross
    rank is its node's rank."""
    groups: dict[Hashable, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return sorted(groups.values(), key=lambda members: (-len(members), members[0]))
