"""A link with latency, where the kernel has no ``netem``: two TAP devices joined by this process.

``tc qdisc ... netem delay`` is the usual way to give a link latency, but kernels built without
``sch_netem`` (this one) refuse it, and ``fq`` with earliest-departure times needs eBPF. So the two
namespace hosts are joined by TAP devices instead of a veth pair: every Ethernet frame one host sends
arrives here, waits ``delay`` seconds, and is written to the other host's TAP, in order. ``tc tbf``
on the TAPs (inside the namespaces) still sets the bandwidth, before the frames reach us.

The process creates both TAPs (``/dev/net/tun``, ``IFF_TAP | IFF_NO_PI``) in its own namespace, prints
``ready``, and keeps forwarding after the caller has moved them into the hosts' namespaces (a TAP
keeps its file descriptor across the move). It runs until SIGTERM or SIGINT and then prints one
``stats`` line (frames, bytes, CPU seconds), since its CPU use competes with the ranks on a small
machine. A large MTU on the TAPs (set by the caller) keeps the number of frames, and so the
per-frame cost of Python, low: about 2-3 Gbit/s through one core here.

    python tests/integration/delay_link.py --tap-a rtA --tap-b rtB --delay-ms 1
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import resource
import select
import signal
import struct
import sys
import time
from collections.abc import Sequence

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME = 65536 + 64
#: Frames read from one device before the other one gets a turn (keeps both directions moving).
READ_BATCH = 64


def open_tap(name: str) -> int:
    """A new TAP device ``name`` (non-persistent: it goes away with this process); its descriptor."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class DelayLine:
    """Frames in flight from one TAP to the other, each released ``delay`` seconds after arrival."""

    def __init__(self, source: int, target: int, delay: float) -> None:
        self.source, self.target, self.delay = source, target, delay
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.frames = 0
        self.bytes = 0
        self.dropped = 0

    def read(self, now: float) -> None:
        for _ in range(READ_BATCH):
            try:
                frame = os.read(self.source, MAX_FRAME)
            except BlockingIOError:
                return
            self.queue.append((now + self.delay, frame))
            self.frames += 1
            self.bytes += len(frame)

    def write_due(self, now: float) -> None:
        while self.queue and self.queue[0][0] <= now:
            _, frame = self.queue[0]
            try:
                os.write(self.target, frame)
            except BlockingIOError:
                return  # the other host's queue is full: try again on the next turn
            except OSError:
                # the other TAP is down (not up yet at setup, or gone at teardown): like a cable to a
                # switched-off port, the frame is lost
                self.dropped += 1
            self.queue.popleft()

    def next_due(self) -> float | None:
        return self.queue[0][0] if self.queue else None


def forward(fd_a: int, fd_b: int, delay: float, stop: list[bool]) -> list[DelayLine]:
    """Forward both ways until ``stop[0]`` turns true; returns the two lines for their counters."""
    lines = [DelayLine(fd_a, fd_b, delay), DelayLine(fd_b, fd_a, delay)]
    by_fd = {fd_a: lines[0], fd_b: lines[1]}
    poller = select.epoll()
    poller.register(fd_a, select.EPOLLIN)
    poller.register(fd_b, select.EPOLLIN)
    try:
        while not stop[0]:
            now = time.monotonic()
            dues = [d for d in (line.next_due() for line in lines) if d is not None]
            timeout = 0.2 if not dues else max(0.0, min(dues) - now)
            try:
                events = poller.poll(timeout)
            except InterruptedError:
                continue
            now = time.monotonic()
            for fd, _ in events:
                by_fd[fd].read(now)
            for line in lines:
                line.write_due(now)
    finally:
        poller.close()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tap-a", required=True, help="name of the first TAP device to create")
    parser.add_argument("--tap-b", required=True, help="name of the second TAP device to create")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay in milliseconds")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error(f"--delay-ms {args.delay_ms} must be >= 0")
    fd_a, fd_b = open_tap(args.tap_a), open_tap(args.tap_b)
    stop = [False]

    def request_stop(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print("ready", flush=True)
    lines = forward(fd_a, fd_b, args.delay_ms / 1000.0, stop)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print("stats " + json.dumps({"frames": [line.frames for line in lines],
                                 "bytes": [line.bytes for line in lines],
                                 "dropped": [line.dropped for line in lines],
                                 "cpu_seconds": usage.ru_utime + usage.ru_stime}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
