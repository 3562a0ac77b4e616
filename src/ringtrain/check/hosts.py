"""Across hosts: where each rank runs, the bandwidth between hosts, and hosts that differ.

Every rank reports its host's network interfaces, the addresses other ranks reached it on, its clock
and its versions of ringtrain, torch and Python; the allreduce bandwidth of each pair of hosts is
measured on a process set of one rank per host; hosts whose versions or clocks differ get a warning.
"""

from __future__ import annotations

import platform
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

import ringtrain
from ringtrain.check.report import HostSummary, LinkSample, RankSite, summarize_hosts
from ringtrain.engine.netutil import interface_addresses

#: Clocks further apart than this get a warning (logs and timestamps of the hosts stop lining up).
CLOCK_SKEW_WARN_S = 1.0
#: Above this many hosts, links are measured from the first host to each other, not between every pair.
ALL_PAIRS_MAX_HOSTS = 8


def _peer_addresses(rank: int, size: int) -> dict[int, str]:
    """The address of each peer's end of this rank's control connection (empty without the socket mesh)."""
    from ringtrain.engine import state

    plane = state.engine.plane if state.engine is not None else None
    if plane is None:
        return {}
    found = {}
    for peer in range(size):
        if peer == rank:
            continue
        try:
            found[peer] = str(plane.peer_socket(peer).getpeername()[0])
        except OSError:
            found[peer] = ""
    return found


def _clock_offsets(hvd: ModuleType, rounds: int = 3) -> list[float]:
    """Each rank's clock minus rank 0's, taken right after barriers (error: the barrier's release spread)."""
    samples = []
    for k in range(rounds):
        hvd.barrier()
        now = time.time()
        times = hvd.allgather_object(now, name=f"check.clock.{k}")
        samples.append([t - times[0] for t in times])
    return [statistics.median(column) for column in zip(*samples)]


def gather_hosts(hvd: ModuleType) -> list[RankSite]:
    """Every rank's :class:`RankSite`, in rank order, on every rank (collective)."""
    rank, size = hvd.rank(), hvd.size()
    offsets = _clock_offsets(hvd)
    mine = RankSite(rank=rank, host=socket.gethostname(), interfaces=interface_addresses(),
                    peers=_peer_addresses(rank, size), clock_offset=offsets[rank],
                    versions={"ringtrain": str(ringtrain.__version__), "torch": str(torch.__version__),
                              "python": platform.python_version()},
                    gloo_ifname=_gloo_ifname())
    return list(hvd.allgather_object(mine, name="check.sites"))


def _gloo_ifname() -> str:
    """The interfaces this rank's engine was told to use (GLOO_SOCKET_IFNAME), as its settings hold them."""
    from ringtrain.engine import state

    engine = state.engine
    return ",".join(engine.settings.gloo_socket_ifname) if engine is not None else ""


def reached_on(sites: Sequence[RankSite], rank: int) -> list[str]:
    """The addresses other hosts' ranks reached ``rank`` on (what a firewall or interface choice sees)."""
    host = sites[rank].host
    found = []
    for site in sites:
        address = site.peers.get(rank, "")
        if site.host != host and address and address not in found:
            found.append(address)
    return found


def link_pairs(hosts: Sequence[HostSummary]) -> list[tuple[HostSummary, HostSummary]]:
    """Every pair of hosts, or from the first host to each other one when there are many."""
    if len(hosts) <= ALL_PAIRS_MAX_HOSTS:
        return [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:]]
    return [(hosts[0], b) for b in hosts[1:]]


def measure_links(hvd: ModuleType, sites: Sequence[RankSite], nbytes: int, iterations: int,
                  progress: Callable[[str], None] | None = None) -> list[LinkSample]:
    """Allreduce bandwidth of each pair of hosts, on a process set of their first ranks (collective).

    Needs ``hvd.init(process_sets="dynamic")``. Pairs are measured one after another, so each link
    carries only its own test.
    """
    rank = hvd.rank()
    samples = []
    for a, b in link_pairs(summarize_hosts(sites)):
        pair = (a.ranks[0], b.ranks[0])
        if progress is not None:
            progress(f"link {a.host} <-> {b.host}")
        whole_world = hvd.size() == 2  # the pair is every rank: the global set (a copy would be refused)
        process_set = hvd.global_process_set if whole_world else hvd.add_process_set(list(pair))
        try:
            if rank in pair:
                tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
                name = f"check.link.{pair[0]}.{pair[1]}"
                hvd.allreduce(tensor, name=name, op=hvd.Sum, process_set=process_set)  # warm-up
                times = []
                for _ in range(iterations):
                    start = time.perf_counter()
                    hvd.allreduce(tensor, name=name, op=hvd.Sum, process_set=process_set)
                    times.append(time.perf_counter() - start)
                if rank == pair[0]:  # both ends timed it; the lower rank's sample speaks for the link
                    seconds = statistics.median(times)
                    actual = tensor.numel() * 4
                    samples.append(LinkSample(a.host, b.host, pair, actual, seconds,
                                              actual / seconds / 1e6 if seconds > 0 else float("inf")))
        finally:
            if not whole_world:
                hvd.remove_process_set(process_set)
    gathered = hvd.allgather_object(samples, name="check.links")
    return [sample for per_rank in gathered for sample in per_rank]


def host_warnings(sites: Sequence[RankSite]) -> list[str]:
    """Warnings about hosts that differ: versions of ringtrain, torch or Python, and clocks."""
    warnings = []
    hosts = summarize_hosts(sites)
    for package in ("ringtrain", "torch", "python"):
        seen: dict[str, list[str]] = {}
        for site in sites:
            where = f"{site.host} (rank {site.rank})"
            seen.setdefault(site.versions.get(package, "?"), []).append(where)
        if len(seen) > 1:
            listing = "; ".join(f"{version} on {', '.join(where)}" for version, where in seen.items())
            reference = sites[0].versions.get(package, "?")
            fix = (f"pip install {package}=={reference}" if package != "python"
                   else f"use Python {reference} everywhere")
            warnings.append(f"{package} versions differ between ranks: {listing}. Ranks that run different "
                            f"versions can disagree on messages and results. HINT: install the same version "
                            f"on every host, e.g. {fix}.")
    far = [h for h in hosts if abs(h.clock_offset) >= CLOCK_SKEW_WARN_S]
    if far:
        listing = ", ".join(f"{h.host} {h.clock_offset:+.1f} s" for h in far)
        warnings.append(f"clocks differ from {hosts[0].host}'s by {listing}: log times and snapshot times of "
                        "the hosts do not line up, and munge or Kerberos may refuse credentials. HINT: run "
                        "an NTP client (chrony, ntpd, systemd-timesyncd) on every host.")
    return warnings
