"""Hosts and slots: ``-H host:slots,...``, hostfiles, and horovodrun's slot assignment.

Hosts are filled in the order given: the first host gets ranks 0 .. slots-1, the next host the
following ones, and so on, until ``-np`` ranks are placed. Hosts that receive no rank are dropped.
"""

from __future__ import annotations

import itertools
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ringtrain.engine.placement import places_by_node
from ringtrain.exceptions import UsageError

_HOST_ENTRY = re.compile(r"^[\w.-]+:[0-9]+$")
_HOSTFILE_LINE = re.compile(r"^(?P<host>[\w.-]+)(?:\s+slots\s*=\s*(?P<slots>[0-9]+))?\s*$")


@dataclass(frozen=True)
class HostSlots:
    """One host and the number of processes it may run."""

    host: str
    slots: int


@dataclass(frozen=True)
class SlotAssignment:
    """Where one rank runs: Horovod's (host, local rank, cross rank) triple plus sizes."""

    rank: int
    host: str
    node_rank: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def parse_hosts(spec: str) -> tuple[HostSlots, ...]:
    """Parse ``-H h1:2,h2:4``; every entry needs an explicit slot count, as in horovodrun.

    An empty entry (``a:2,,b:1``, a leading or trailing comma) is an error, as it is for horovodrun,
    whose every entry must match ``host:slots``: a host dropped from a list written by hand or by a
    script is more likely a mistake than an intent.
    """
    parts = [part.strip() for part in spec.split(",")]
    entries = [part for part in parts if part]
    if not entries:
        raise UsageError(f"-H {spec!r} names no host. HINT: write -H host1:slots,host2:slots, "
                         "e.g. -H localhost:2.")
    if len(entries) < len(parts):
        raise UsageError(f"-H {spec!r} has an empty entry (two commas in a row, or a comma at an end). "
                         f"HINT: separate the hosts by single commas: -H {','.join(entries)}.")
    hosts = []
    for entry in entries:
        if not _HOST_ENTRY.match(entry):
            raise UsageError(f"-H entry {entry!r} is not of the form host:slots. HINT: write each host as "
                             "name:count with a whole number of slots, e.g. -H node1:4,node2:4.")
        name, slots = entry.rsplit(":", 1)
        if int(slots) <= 0:
            raise UsageError(f"-H entry {entry!r} has no slots. HINT: give each host at least one slot.")
        hosts.append(HostSlots(name, int(slots)))
    return _merge_duplicates(hosts, "-H")


def parse_hostfile(path: str | Path) -> tuple[HostSlots, ...]:
    """Read a hostfile: ``host slots=N`` per line (slots default to 1), ``#`` comments, blank lines."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"hostfile {str(path)!r} does not exist. HINT: pass the path of a file with "
                         "lines like 'node1 slots=4'.") from None
    except OSError as exc:
        raise UsageError(f"hostfile {str(path)!r} cannot be read: {exc.strerror}. "
                         "HINT: check the path and its permissions.") from None
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _HOSTFILE_LINE.match(line)
        if not match:
            raise UsageError(f"hostfile {str(path)!r} line {number}: {raw.strip()!r} is not 'host slots=N'. "
                             "HINT: write one host per line, e.g. 'node1 slots=4'.")
        slots = int(match.group("slots") or 1)
        if slots <= 0:
            raise UsageError(f"hostfile {str(path)!r} line {number}: {raw.strip()!r} has no slots. "
                             "HINT: give each host at least one slot (slots=1).")
        hosts.append(HostSlots(match.group("host"), slots))
    if not hosts:
        raise UsageError(f"hostfile {str(path)!r} lists no host. HINT: add lines like 'node1 slots=4'.")
    return _merge_duplicates(hosts, f"hostfile {str(path)!r}")


def _merge_duplicates(hosts: list[HostSlots], source: str) -> tuple[HostSlots, ...]:
    seen: set[str] = set()
    for entry in hosts:
        if entry.host in seen:
            raise UsageError(f"{source} lists host {entry.host!r} twice. HINT: list each host once with "
                             "the total of its slots.")
        seen.add(entry.host)
    return tuple(hosts)


def assign_slots(hosts: Sequence[HostSlots], num_proc: int) -> list[SlotAssignment]:
    """Place ``num_proc`` ranks on ``hosts`` in order, as horovodrun does; too few slots is an error."""
    total = sum(h.slots for h in hosts)
    if num_proc > total:
        listing = ",".join(f"{h.host}:{h.slots}" for h in hosts)
        raise UsageError(f"-np {num_proc} asks for more processes than the {total} slots of {listing}. "
                         f"HINT: lower -np to at most {total} or add slots to the hosts.")
    used: list[tuple[str, int]] = []
    remaining = num_proc
    for entry in hosts:
        if remaining <= 0:
            break
        take = min(entry.slots, remaining)
        used.append((entry.host, take))
        remaining -= take
    starts = itertools.accumulate((take for _, take in used), initial=0)
    nodes = [range(start, start + take) for start, (_, take) in zip(starts, used)]
    return [SlotAssignment(rank=p.rank, host=used[p.node_rank][0], node_rank=p.node_rank,
                           local_rank=p.local_rank, local_size=p.local_size, cross_rank=p.cross_rank,
                           cross_size=p.cross_size) for p in places_by_node(nodes)]


def nodes_of(assignments: Sequence[SlotAssignment]) -> list[HostSlots]:
    """The hosts that received ranks, in node-rank order, with the number of ranks each got."""
    nodes: dict[str, int] = {}
    for a in assignments:
        nodes[a.host] = a.local_size
    return [HostSlots(h, s) for h, s in nodes.items()]


_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "127.0.0.1", "::1", "ip6-localhost"}


def is_local_host(host: str) -> bool:
    """True when ``host`` is this machine: a loopback name, our own name, or an address we can bind.

    Binding is the test that also holds inside network namespaces: a name resolving to an address
    of another namespace cannot be bound here, even when the hostnames look alike.
    """
    if host in _LOOPBACK_NAMES or host in {socket.gethostname(), socket.gethostname().split(".")[0]}:
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def is_loopback_name(host: str) -> bool:
    """True for names that mean "this machine" to whoever reads them (useless to other hosts)."""
    return host in _LOOPBACK_NAMES or host.startswith("127.")
