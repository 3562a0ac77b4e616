"""Ring allreduce of CPU tensors over the control plane's sockets.

Gloo's CPU allreduce hands every message from the calling thread to a worker thread and from there
to an I/O thread, and waits on condition variables in between. On a small machine, where the ranks'
threads compete for few cores, those hand-offs cost more than moving the bytes: measured on a
2-core VM, a 1 MiB allreduce of two ranks took 2.0 ms through gloo and 0.55 ms as the ring below,
and 64 MiB 68 ms against 41 ms. Here the engine thread moves the data itself with non-blocking
sockets, sending and receiving at once, and sleeps in ``poll`` only when neither side can move.

The algorithm is the classic ring: the tensor is cut into one chunk per member; in ``n - 1``
reduce-scatter steps every member sends one chunk to its successor and folds the chunk it receives
from its predecessor into its own copy, so that each member ends up holding one fully reduced chunk;
in ``n - 1`` allgather steps those chunks travel around the ring. Each member sends and receives
``2 (n - 1) / n`` times the tensor, the minimum for an allreduce. Every chunk is reduced on one rank
and copied to the others, so all ranks hold bit-identical results.

Every step's message starts with its length, which the receiver checks against the one it expects
from the agreed metadata: a stream that went out of step fails loudly instead of reducing garbage.
"""

from __future__ import annotations

import select
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from ringtrain.engine.control_plane import ControlPlaneError

#: Received reduce-scatter data is folded in pieces of this many bytes, so the scratch space stays
#: small whatever the tensor size and folding overlaps with the transfer of the next piece.
PIECE_BYTES = 1024 * 1024

_STEP_HEADER = struct.Struct("<Q")
_POLL_OUT = select.POLLOUT
_POLL_IN = select.POLLIN | select.POLLPRI

#: ``combine(a, b, out=...)``: an elementwise reduction such as ``torch.add``.
Combine = Callable[..., torch.Tensor]


def ring_allreduce(
    plane: Any, members: Sequence[int], flat: torch.Tensor, combine: Combine, piece_bytes: int = PIECE_BYTES
) -> None:
    """Allreduce the 1-D CPU tensor ``flat`` in place among ``members`` (global ranks, set order).

    ``combine`` reduces two tensors elementwise (``torch.add`` for a sum); received pieces are folded
    into the matching slice of ``flat`` with ``out=`` that slice. Every member calls this with the same
    shape, dtype and members.
    """
    count = len(members)
    if count < 2 or flat.numel() == 0:
        return
    if not flat.is_contiguous():
        work = flat.contiguous()
        ring_allreduce(plane, members, work, combine, piece_bytes)
        flat.copy_(work)
        return
    me = members.index(plane.rank)
    successor = members[(me + 1) % count]
    predecessor = members[(me - 1) % count]
    out_sock, in_sock = plane.peer_socket(successor), plane.peer_socket(predecessor)
    n = flat.numel()
    bounds = [n * i // count for i in range(count + 1)]
    item = flat.element_size()
    raw = flat.view(torch.uint8).numpy().data

    def chunk(index: int) -> tuple[int, int]:
        return bounds[index % count], bounds[index % count + 1]

    piece_elements = max(1, piece_bytes // item)
    largest = max(bounds[i + 1] - bounds[i] for i in range(count))
    scratch = plane.scratch(min(largest, piece_elements) * item).view(flat.dtype)
    scratch_raw = scratch.view(torch.uint8).numpy().data
    links = (out_sock, plane.label(successor), in_sock, plane.label(predecessor))
    with plane.nonblocking(out_sock, in_sock) as deadline:
        for step in range(count - 1):
            send_lo, send_hi = chunk(me - step)
            recv_lo, recv_hi = chunk(me - step - 1)
            pieces: list[tuple[memoryview, Callable[[], Any] | None]] = []
            for lo in range(recv_lo, recv_hi, piece_elements):
                hi = min(lo + piece_elements, recv_hi)
                target = flat[lo:hi]
                part = scratch[: hi - lo]
                pieces.append((scratch_raw[: (hi - lo) * item], partial(combine, target, part, out=target)))
            outgoing = raw[send_lo * item : send_hi * item]
            transfer(links, outgoing, pieces, (recv_hi - recv_lo) * item, deadline)
        for step in range(count - 1):
            send_lo, send_hi = chunk(me + 1 - step)
            recv_lo, recv_hi = chunk(me - step)
            target_raw = raw[recv_lo * item : recv_hi * item]
            outgoing = raw[send_lo * item : send_hi * item]
            transfer(links, outgoing, [(target_raw, None)], len(target_raw), deadline)


def transfer(
    links: tuple[Any, str, Any, str],
    payload: memoryview,
    pieces: list[tuple[memoryview, Callable[[], Any] | None]],
    expected: int,
    deadline: float,
) -> None:
    """Send ``payload`` to the successor while receiving ``expected`` bytes from the predecessor.

    ``links`` is (successor socket, its name, predecessor socket, its name). Both directions progress
    together (a blocking send could wait for a peer that is itself blocked sending to us). Received
    bytes fill ``pieces`` in order; a piece's callback runs once it is full, before the next is read.
    """
    out_sock, out_name, in_sock, in_name = links
    outgoing: deque[memoryview] = deque([memoryview(_STEP_HEADER.pack(len(payload)))])
    if len(payload):
        outgoing.append(payload)
    header = bytearray(_STEP_HEADER.size)
    incoming: deque[tuple[memoryview, Callable[[], Any] | None]] = deque([(memoryview(header), None)])
    incoming.extend(piece for piece in pieces if len(piece[0]))
    header_pending = True
    poller = None
    while outgoing or incoming:
        moved = False
        if outgoing:
            try:
                sent = out_sock.send(outgoing[0])
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise _broken(out_name, exc) from exc
            if sent:
                moved = True
                if sent == len(outgoing[0]):
                    outgoing.popleft()
                else:
                    outgoing[0] = outgoing[0][sent:]
        if incoming:
            view, done = incoming[0]
            try:
                got = in_sock.recv_into(view)
            except BlockingIOError:
                got = -1
            except OSError as exc:
                raise _broken(in_name, exc) from exc
            if got == 0:
                raise ControlPlaneError(
                    f"{in_name} closed its connection during an allreduce (it exited or failed)"
                )
            if got > 0:
                moved = True
                if got < len(view):
                    incoming[0] = (view[got:], done)
                else:
                    incoming.popleft()
                    if header_pending:
                        header_pending = False
                        (length,) = _STEP_HEADER.unpack(header)
                        if length != expected:
                            raise ControlPlaneError(
                                f"{in_name} sent {length} bytes for an allreduce step that expects "
                                f"{expected} (the ranks' streams are out of step: a bug)"
                            )
                    elif done is not None:
                        done()
        if moved:
            continue
        # Neither side can move: sleep in the kernel until one can, so a late peer costs no CPU.
        if poller is None:
            poller = select.poll()
        events = {}
        if outgoing:
            events[out_sock.fileno()] = _POLL_OUT
        if incoming:
            events[in_sock.fileno()] = events.get(in_sock.fileno(), 0) | _POLL_IN
        for fd, mask in events.items():
            poller.register(fd, mask)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ControlPlaneError(
                f"an allreduce step between {in_name} and {out_name} made no progress within the "
                "round timeout (RINGTRAIN_ROUND_TIMEOUT_SECONDS)"
            )
        ready = poller.poll(min(remaining, 3600.0) * 1000.0)
        for fd in events:
            poller.unregister(fd)
        for _, flags in ready:
            if flags & select.POLLNVAL:
                raise ControlPlaneError("an allreduce socket was closed under the transfer")
        # POLLERR / POLLHUP surface as an error or end-of-file from the next send or receive.


def _broken(name: str, exc: OSError) -> ControlPlaneError:
    return ControlPlaneError(f"the connection to {name} failed during an allreduce: {exc}")
