"""Hierarchical collectives: one rank per host talks across hosts.

``HOROVOD_HIERARCHICAL_ALLREDUCE=1`` (``ringtrain run --hierarchical-allreduce``): the ranks of each host
reduce into the host's first rank (its *root*), the roots allreduce among themselves, and each root
broadcasts the result to its host. ``HOROVOD_HIERARCHICAL_ALLGATHER=1``: each root gathers its host's
parts, the roots allgather the host blocks, and each root broadcasts the whole result to its host.
Only the roots send data between hosts, once per host instead of once per rank: worth it where the
link between hosts is much slower than the one inside a host.

A host is the set of ranks with the same host name and node rank (``GROUP_RANK`` / ``NODE_RANK`` /
``HOROVOD_CROSS_RANK``, whichever the launcher set), learned once at ``init``. When on, every allreduce
(or allgather) of every process set takes this path, on one host too (then it is a reduce and a
broadcast). Rank 0's setting decides for the job. Small
Sum/Average allreduces that complete inside the negotiation round (see docs/engine.md) never reach
the data path, hierarchical or not.

Adasum (:mod:`ringtrain.engine.adasum`) uses the same structure for CUDA tensors, as Horovod's NCCL
build does: average within each host, Adasum among the roots (on host copies), broadcast within each
host; and for CPU tensors too when hierarchical allreduce is on.

The transfers run on :mod:`ringtrain.engine.peers`: the control plane's sockets for CPU tensors (or
gloo groups of the hosts and of the roots when the job runs CPU allreduces on gloo), NCCL groups of the
hosts and of the roots for CUDA tensors, built the first time they are needed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ringtrain.engine.adasum import adasum_allreduce
from ringtrain.engine.peers import GlooPeers, NcclPeers, Peers, SocketPeers
from ringtrain.engine.settings import Settings
from ringtrain.engine.world_rendezvous import World, make_gloo_group, make_nccl_group


def host_key(world: World) -> int:
    """A 63-bit number that is equal for ranks on the same host (same host name and node rank)."""
    text = f"{world.hostname}|{world.node_rank}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class Topology:
    """Which host every global rank is on, and whether the hierarchical collectives are on."""

    hosts: tuple[int, ...]
    allreduce: bool = False
    allgather: bool = False

    @classmethod
    def discover(cls, world: World, ctrl: Any, agree: Callable[[str, Callable[[], str]], str],
                 settings: Settings) -> Topology:
        """Every rank's host (one allgather on the control group) and rank 0's settings."""
        mine = torch.tensor([host_key(world)], dtype=torch.int64)
        if world.size > 1:
            rows = [torch.empty(1, dtype=torch.int64) for _ in range(world.size)]
            ctrl.allgather([rows], [mine]).wait()
        else:
            rows = [mine]
        # Every rank read (and checked) its own value in hvd.init(); rank 0's decides.
        allreduce = "1" if settings.hierarchical_allreduce else "0"
        allgather = "1" if settings.hierarchical_allgather else "0"
        return cls(
            hosts=tuple(int(row.item()) for row in rows),
            allreduce=agree("ctrl/hierarchical_allreduce", lambda: allreduce) == "1",
            allgather=agree("ctrl/hierarchical_allgather", lambda: allgather) == "1",
        )


class Hierarchy:
    """The hosts of one process set as seen from this rank, and the peers its collectives use."""

    def __init__(self, topology: Topology, world: World, groups: Any, settings: Settings) -> None:
        self.topology, self.world, self.set_groups, self.settings = topology, world, groups, settings
        by_host: dict[int, list[int]] = {}
        for rank in groups.ranks:
            by_host.setdefault(topology.hosts[rank], []).append(rank)
        #: Global ranks of each host of the set, hosts in order of their first rank.
        self.hosts: list[list[int]] = list(by_host.values())
        self.roots = [host[0] for host in self.hosts]
        self.host_index = next((i for i, host in enumerate(self.hosts) if world.rank in host), -1)
        self.local = self.hosts[self.host_index] if self.host_index >= 0 else []
        self.is_root = bool(self.local) and self.local[0] == world.rank
        self._peers: dict[tuple[str, bool], Peers] = {}
        #: Hierarchical operations run so far (tests and ``ringtrain check`` read it).
        self.runs = 0

    def applies_to_allreduce(self) -> bool:
        return self.topology.allreduce

    def applies_to_allgather(self) -> bool:
        return self.topology.allgather

    def adasum_by_host(self, device: int) -> bool:
        """Adasum averages within hosts first: always for CUDA tensors (Horovod's NCCL build), for CPU
        tensors under hierarchical allreduce when the set spans several hosts (else plain Adasum)."""
        return device >= 0 or (self.topology.allreduce and len(self.hosts) > 1)

    # --------------------------------------------------------------------- peers
    def cpu_peers(self, members: list[int], tag: str) -> Peers:
        """CPU transfers among ``members``: the socket mesh, or a gloo group where CPU data runs on gloo."""
        key = (tag, False)
        if key not in self._peers:
            groups = self.set_groups
            if groups.plane is not None and groups.ring:
                peers: Peers = SocketPeers(groups.plane, members)
            elif members == groups.ranks:
                peers = GlooPeers(groups.gloo, members, self.world.rank)
            else:
                group = make_gloo_group(self.world, f"set{groups.set_id}/{tag}", members,
                                        self.settings.gloo_timeout_s, self.settings.gloo_socket_ifname)
                peers = GlooPeers(group, members, self.world.rank)
            self._peers[key] = peers
        return self._peers[key]

    def _peers_for(self, members: list[int], tag: str, device: int) -> Peers:
        if device < 0:
            return self.cpu_peers(members, tag)
        key = (tag, True)
        if key not in self._peers:
            group = make_nccl_group(self.world, f"set{self.set_groups.set_id}/{tag}", members,
                                    self.settings.gloo_timeout_s)
            self._peers[key] = NcclPeers(group, members, self.world.rank, device)
        return self._peers[key]

    def local_peers(self, device: int) -> Peers:
        return self._peers_for(self.local, f"host{self.host_index}", device)

    def cross_peers(self, device: int) -> Peers:
        return self._peers_for(self.roots, "roots", device)


# ------------------------------------------------------------------------- collectives
def allreduce(hierarchy: Hierarchy, flat: torch.Tensor, combine: Callable[..., torch.Tensor], op: Any,
              device: int) -> None:
    """Reduce ``flat`` (1-D) over the set in place: within hosts, across roots, back within hosts."""
    hierarchy.runs += 1
    local = hierarchy.local_peers(device)
    if local.size > 1:
        local.reduce(flat, 0, combine, op)
    if hierarchy.is_root and len(hierarchy.roots) > 1:
        hierarchy.cross_peers(device).allreduce(flat, combine, op)
    if local.size > 1:
        local.broadcast(flat, 0)


def adasum(hierarchy: Hierarchy, flat: torch.Tensor, counts: Sequence[int], device: int) -> None:
    """Horovod's hierarchical Adasum: average within each host, Adasum among the roots, broadcast."""
    hierarchy.runs += 1
    local = hierarchy.local_peers(device)
    if local.size > 1:
        local.reduce(flat, 0, torch.add, dist.ReduceOp.SUM)
    if hierarchy.is_root:
        if local.size > 1:
            flat.div_(local.size)
        if len(hierarchy.roots) > 1:
            host = flat if device < 0 else flat.cpu()
            adasum_allreduce(hierarchy.cpu_peers(hierarchy.roots, "roots"), host, counts)
            if host is not flat:
                flat.copy_(host)
    if local.size > 1:
        local.broadcast(flat, 0)


def allgather(hierarchy: Hierarchy, mine: torch.Tensor, sizes: dict[int, int], out: torch.Tensor,
              device: int) -> None:
    """Gather every member's bytes into ``out`` (set order): within hosts, across roots, broadcast.

    ``mine`` and ``out`` are flat uint8 tensors; ``sizes`` gives every member's byte count by global rank.
    """
    hierarchy.runs += 1
    local = hierarchy.local_peers(device)
    local_sizes = [sizes[rank] for rank in hierarchy.local]
    parts = local.gather(mine, local_sizes, 0) if local.size > 1 else [mine]
    if hierarchy.is_root:
        assert parts is not None
        block = torch.cat(parts) if len(parts) > 1 else parts[0]
        host_sizes = [sum(sizes[rank] for rank in host) for host in hierarchy.hosts]
        if len(hierarchy.roots) > 1:
            blocks = hierarchy.cross_peers(device).allgather(block, host_sizes)
        else:
            blocks = [block]
        offsets, offset = {}, 0
        for rank in hierarchy.set_groups.ranks:
            offsets[rank] = offset
            offset += sizes[rank]
        for host, host_block in zip(hierarchy.hosts, blocks):
            start = 0
            for rank in host:
                count = sizes[rank]
                out[offsets[rank] : offsets[rank] + count].copy_(host_block[start : start + count])
                start += count
    if local.size > 1 and out.numel() > 0:
        local.broadcast(out, 0)


def adasum_over_set(hierarchy: Hierarchy, flat: torch.Tensor, counts: Sequence[int], device: int) -> None:
    """Adasum of the set's ``flat`` vectors in place: by host where that applies (see
    :meth:`Hierarchy.adasum_by_host`), else the pairwise tree over all members."""
    if hierarchy.adasum_by_host(device):
        adasum(hierarchy, flat, counts, device)
    else:
        adasum_allreduce(hierarchy.cpu_peers(hierarchy.set_groups.ranks, "all"), flat, counts)


def run_allgather(hierarchy: Hierarchy, response: Any, request: Any) -> None:
    """The executor's allgather of a request's tensors (dim 0 may differ per rank), through the roots."""
    device = request.meta.device  # this rank's GPU (the reference rank may use another)
    members = hierarchy.set_groups.ranks
    for i, tensor in enumerate(request.inputs):
        row_shape = tuple(tensor.shape[1:])
        row_bytes = math.prod(row_shape) * tensor.element_size()
        rows = {r: response.metas[r].shapes[i][0] for r in members}
        out = torch.empty((sum(rows.values()), *row_shape), dtype=tensor.dtype, device=tensor.device)
        allgather(hierarchy, _as_bytes(tensor), {r: n * row_bytes for r, n in rows.items()}, _as_bytes(out),
                  device)
        request.outputs[i] = out


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


__all__ = ["Hierarchy", "Topology", "adasum", "adasum_over_set", "allgather", "allreduce", "run_allgather"]
