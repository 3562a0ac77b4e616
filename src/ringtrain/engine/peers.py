"""Transfers among some of the ranks: the building blocks of Adasum and of the hierarchical collectives.

A :class:`Peers` object stands for an ordered list of members (global ranks) that this process belongs
to; methods take and return member *indices*. Every member calls the same methods in the same order
(the engine runs agreed responses in the same order everywhere), so no message needs a name.

Three implementations:

- :class:`SocketPeers`: CPU tensors over the control plane's sockets, the connections the socket ring
  already uses (no extra group to build, no hand-off to gloo's threads).
- :class:`GlooPeers`: CPU tensors over a gloo process group of exactly the members (used when the job
  runs its CPU allreduces on gloo, ``RINGTRAIN_CPU_ALLREDUCE=gloo`` or ``RINGTRAIN_CONTROL_PLANE=gloo``).
- :class:`NcclPeers`: CUDA tensors over an NCCL group of the members; collectives only (the engine
  never needs NCCL point-to-point: Adasum's pairwise steps run on the host, as in Horovod).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ringtrain.engine import liveness
from ringtrain.engine.control_plane import ControlPlaneError
from ringtrain.engine.netutil import PeerClosedError, recv_into_exact
from ringtrain.engine.socket_ring import ring_allreduce, transfer

_HEADER = struct.Struct("<Q")
#: Gloo matches point-to-point messages by (peer, tag); members call in the same order, so one tag does.
_TAG = 7341


def _raw(tensor: torch.Tensor) -> memoryview:
    return tensor.reshape(-1).view(torch.uint8).numpy().data


class Peers:
    """An ordered list of members (global ranks) and this process's index ``me`` among them."""

    def __init__(self, members: Sequence[int], rank: int) -> None:
        self.members = list(members)
        self.me = self.members.index(rank)

    @property
    def size(self) -> int:
        return len(self.members)

    # Point-to-point (CPU implementations only).
    def shift(self, to: int, send: torch.Tensor, source: int, recv: torch.Tensor) -> None:
        """Send ``send`` to member ``to`` while receiving ``recv`` (its size is agreed) from ``source``."""
        raise NotImplementedError

    def send(self, to: int, tensor: torch.Tensor) -> None:
        raise NotImplementedError

    def recv(self, source: int, tensor: torch.Tensor) -> None:
        raise NotImplementedError

    def exchange(self, peer: int, send: torch.Tensor, recv: torch.Tensor) -> None:
        """Swap tensors with one member (both directions at once)."""
        self.shift(peer, send, peer, recv)

    # Collectives, in place on ``tensor``; ``root`` is a member index.
    def reduce(self, tensor: torch.Tensor, root: int, combine: Callable[..., torch.Tensor], op: Any) -> None:
        """Every member's ``tensor`` combined into the root's (``combine(a, b, out=a)``, e.g. torch.add;
        ``op`` is the same reduction as a ``torch.distributed.ReduceOp``)."""
        if self.me == root:
            part = torch.empty_like(tensor)
            for source in range(self.size):  # member order: the same result on every run
                if source != root:
                    self.recv(source, part)
                    combine(tensor, part, out=tensor)
        else:
            self.send(root, tensor)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        if self.me == root:
            for to in range(self.size):
                if to != root:
                    self.send(to, tensor)
        else:
            self.recv(root, tensor)

    def allreduce(self, tensor: torch.Tensor, combine: Callable[..., torch.Tensor], op: Any) -> None:
        raise NotImplementedError

    def gather(self, tensor: torch.Tensor, sizes: Sequence[int], root: int) -> list[torch.Tensor] | None:
        """Every member's 1-D ``tensor`` (member i holds ``sizes[i]`` elements) on the root, else None."""
        if self.me != root:
            self.send(root, tensor)
            return None
        parts = []
        for source, count in enumerate(sizes):
            if source == root:
                parts.append(tensor)
            else:
                part = tensor.new_empty(count)
                self.recv(source, part)
                parts.append(part)
        return parts

    def allgather(self, tensor: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
        """Every member's 1-D ``tensor`` on every member, as a ring: ``size - 1`` shifts."""
        parts: list[torch.Tensor] = [tensor.new_empty(count) for count in sizes]
        parts[self.me] = tensor
        successor, predecessor = (self.me + 1) % self.size, (self.me - 1) % self.size
        for step in range(self.size - 1):
            outgoing = (self.me - step) % self.size
            incoming = (self.me - step - 1) % self.size
            self.shift(successor, parts[outgoing], predecessor, parts[incoming])
        return parts


class SocketPeers(Peers):
    """CPU transfers over the control plane's sockets (``plane`` connects every pair of global ranks)."""

    def __init__(self, plane: Any, members: Sequence[int]) -> None:
        super().__init__(members, plane.rank)
        self.plane = plane

    def shift(self, to: int, send: torch.Tensor, source: int, recv: torch.Tensor) -> None:
        out_rank, in_rank = self.members[to], self.members[source]
        out_sock, in_sock = self.plane.peer_socket(out_rank), self.plane.peer_socket(in_rank)
        expected = recv.numel() * recv.element_size()
        with self.plane.nonblocking(out_sock, in_sock) as deadline:
            links = (out_sock, self.plane.label(out_rank), in_sock, self.plane.label(in_rank))
            transfer(links, _raw(send), [(_raw(recv), None)], expected, deadline)

    def send(self, to: int, tensor: torch.Tensor) -> None:
        peer = self.members[to]
        payload = _raw(tensor)
        try:
            sock = self.plane.peer_socket(peer)
            sock.sendall(_HEADER.pack(len(payload)))
            sock.sendall(payload)
        except OSError as exc:
            self.plane.close()
            raise ControlPlaneError(f"connection to rank {peer} failed during a transfer: {exc}") from exc

    def recv(self, source: int, tensor: torch.Tensor) -> None:
        peer = self.members[source]
        target = _raw(tensor)
        try:
            sock = self.plane.peer_socket(peer)
            header = bytearray(_HEADER.size)
            self._fill(sock, memoryview(header), peer)
            (length,) = _HEADER.unpack(header)
            if length != len(target):
                raise ControlPlaneError(f"rank {peer} sent {length} bytes where {len(target)} were agreed "
                                        "(the ranks' streams are out of step: a bug)")
            self._fill(sock, target, peer)
        except ControlPlaneError:
            self.plane.close()
            raise
        except OSError as exc:
            self.plane.close()
            raise ControlPlaneError(f"connection to rank {peer} failed during a transfer: {exc}") from exc

    @staticmethod
    def _fill(sock: Any, view: memoryview, peer: int) -> None:
        try:
            recv_into_exact(sock, view)
        except PeerClosedError:
            raise ControlPlaneError(f"rank {peer} closed its connection during a transfer "
                                    "(it exited or failed)") from None

    def allreduce(self, tensor: torch.Tensor, combine: Callable[..., torch.Tensor], op: Any) -> None:
        ring_allreduce(self.plane, self.members, tensor.reshape(-1), combine)


class _GroupPeers(Peers):
    """Members that share a torch.distributed process group (group rank = member index)."""

    def __init__(self, group: Any, members: Sequence[int], rank: int, device: int) -> None:
        super().__init__(members, rank)
        self.group = group
        self.device = device

    def _wait(self, work: Any) -> None:
        if self.device >= 0:
            work.wait()
            torch.cuda.current_stream(self.device).synchronize()
        else:
            # In slices, so that a peer declared failed (the engine's heartbeats) ends the wait.
            liveness.wait_on_group(work, self.group)

    def reduce(self, tensor: torch.Tensor, root: int, combine: Callable[..., torch.Tensor], op: Any) -> None:
        opts = dist.ReduceOptions()
        opts.reduceOp = op
        opts.rootRank = root
        self._wait(self.group.reduce([tensor], opts))

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self._wait(self.group.broadcast([tensor], opts))

    def allreduce(self, tensor: torch.Tensor, combine: Callable[..., torch.Tensor], op: Any) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        self._wait(self.group.allreduce([tensor], opts))

    def _padded_allgather(self, tensor: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
        width = max(sizes)
        send = tensor.new_zeros(width)
        send[: tensor.numel()].copy_(tensor)
        recv = [tensor.new_empty(width) for _ in sizes]
        self._wait(self.group.allgather([recv], [send]))
        return [row[:count] for row, count in zip(recv, sizes)]

    def allgather(self, tensor: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
        if max(sizes) == 0:
            return [tensor.new_empty(0) for _ in sizes]
        return self._padded_allgather(tensor, sizes)

    def gather(self, tensor: torch.Tensor, sizes: Sequence[int], root: int) -> list[torch.Tensor] | None:
        parts = self.allgather(tensor, sizes)
        return parts if self.me == root else None


class GlooPeers(_GroupPeers):
    """CPU transfers over a gloo group of the members."""

    def __init__(self, group: Any, members: Sequence[int], rank: int) -> None:
        super().__init__(group, members, rank, -1)

    def shift(self, to: int, send: torch.Tensor, source: int, recv: torch.Tensor) -> None:
        # Gloo sends asynchronously: post both, then wait, and the two directions overlap.
        sending = self.group.send([send.reshape(-1)], to, _TAG)
        receiving = self.group.recv([recv.reshape(-1)], source, _TAG)
        self._wait(receiving)
        self._wait(sending)

    def send(self, to: int, tensor: torch.Tensor) -> None:
        self._wait(self.group.send([tensor.reshape(-1)], to, _TAG))

    def recv(self, source: int, tensor: torch.Tensor) -> None:
        self._wait(self.group.recv([tensor.reshape(-1)], source, _TAG))


class NcclPeers(_GroupPeers):
    """CUDA tensors over an NCCL group of the members (collectives only)."""


__all__ = ["GlooPeers", "NcclPeers", "Peers", "SocketPeers"]
