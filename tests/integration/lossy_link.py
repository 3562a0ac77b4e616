"""A lossy, slow link between the namespace hosts, without ``netem``: a packet forwarder on a TUN device.

This kernel has no ``sch_netem`` (``tc qdisc add ... netem`` says "Specified qdisc kind is unknown")
and no packet classifiers or netfilter to drop packets with. So the impairment is done in user space:
run inside one host's namespace,

    python -m tests.integration.lossy_link DEV PEER_ADDRESS PEER_MAC --loss 0.05 --delay-ms 10

creates a TUN device there, routes PEER_ADDRESS into it (a /32 route beats the link's /24), and
forwards every IPv4 packet it reads onto DEV as an Ethernet frame to PEER_MAC, after ``--delay-ms``,
dropping each with probability ``--loss``. Only packets from this host to the peer pass through it;
run one on each host to impair both directions. When the process ends (SIGTERM, or the test session
dying) the TUN device and its route vanish with it and the link is plain again.

It prints ``ready`` once the route is in place, and its counts on exit.
"""

from __future__ import annotations

import argparse
import fcntl
import heapq
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_ETH_P_IP = 0x0800


def _mac(text: str) -> bytes:
    return bytes(int(part, 16) for part in text.split(":"))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dev", help="the link's interface in this namespace")
    parser.add_argument("peer", help="the peer host's address")
    parser.add_argument("peer_mac", help="the MAC address of the peer's end of the link")
    parser.add_argument("--loss", type=float, default=0.0, help="probability of dropping a packet")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added to each packet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tun", default=f"rtl{os.getpid() % 100000}")
    args = parser.parse_args(argv)

    with open(f"/sys/class/net/{args.dev}/address") as fp:
        own_mac = _mac(fp.read().strip())
    header = _mac(args.peer_mac) + own_mac + struct.pack("!H", _ETH_P_IP)
    tun = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(tun, _TUNSETIFF, struct.pack("16sH", args.tun.encode(), _IFF_TUN | _IFF_NO_PI))
    os.set_blocking(tun, False)
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    out.bind((args.dev, 0))
    _ip("link", "set", "dev", args.tun, "mtu", "1500", "up")
    _ip("route", "replace", f"{args.peer}/32", "dev", args.tun)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    rng = random.Random(args.seed)
    delay = args.delay_ms / 1000.0
    queue: list[tuple[float, int, bytes]] = []
    counts = {"forwarded": 0, "dropped": 0}
    sequence = 0
    print("ready", flush=True)
    while not stopping:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, packet = heapq.heappop(queue)
            try:
                out.send(header + packet)
                counts["forwarded"] += 1
            except OSError:  # the link is down: the packet is lost, as on a real wire
                counts["dropped"] += 1
        timeout = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            ready, _, _ = select.select([tun], [], [], timeout)
        except InterruptedError:
            continue
        if not ready:
            continue
        while True:
            try:
                packet = os.read(tun, 65536)
            except BlockingIOError:
                break
            if not packet or packet[0] >> 4 != 4:
                continue  # IPv6 and the like are not ours
            if rng.random() < args.loss:
                counts["dropped"] += 1
                continue
            sequence += 1
            heapq.heappush(queue, (time.monotonic() + delay, sequence, packet))
    print(f"forwarded {counts['forwarded']} dropped {counts['dropped']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
