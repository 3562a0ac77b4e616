"""What ``ringtrain check`` finds on one rank: the records of its report, and the host grouping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one rank."""

    name: str
    ok: bool
    detail: str = ""
    #: True when the API declined the operation (e.g. an op it does not support); not a failure.
    skipped: bool = False


@dataclass(frozen=True)
class BandwidthSample:
    """Allreduce timing for one message size, as seen by this rank."""

    nbytes: int
    seconds: float
    #: Bytes reduced per second (size / time), the number users compare.
    algbw_mbps: float
    #: Bytes each rank moved per second in a ring (algbw * 2(n-1)/n), comparable to link speed.
    busbw_mbps: float


@dataclass(frozen=True)
class RankSite:
    """Where one rank runs, as it sees it (:func:`ringtrain.check.hosts.gather_hosts` collects them)."""

    rank: int
    host: str
    interfaces: tuple[tuple[str, str], ...]
    """``(name, IPv4 address or "")`` of every interface of the host."""
    peers: dict[int, str]
    """Rank -> the address of that rank's end of this rank's control connection (from other hosts,
    the address it was reached on; from this host, loopback)."""
    clock_offset: float
    """This rank's clock minus rank 0's, in seconds (median of a few samples taken after barriers)."""
    versions: dict[str, str]
    """``ringtrain``, ``torch`` and ``python`` versions."""
    gloo_ifname: str = ""
    """``GLOO_SOCKET_IFNAME`` of the rank, when set."""


@dataclass(frozen=True)
class HostSummary:
    """One host of the job: its ranks and what they share."""

    host: str
    ranks: tuple[int, ...]
    interfaces: tuple[tuple[str, str], ...]
    clock_offset: float
    versions: dict[str, str]


@dataclass(frozen=True)
class LinkSample:
    """Allreduce bandwidth between two hosts, measured on one rank of each."""

    host_a: str
    host_b: str
    ranks: tuple[int, int]
    nbytes: int
    seconds: float
    #: Bytes each way per second over the link (busbw of a 2-rank allreduce, which equals its algbw).
    mbps: float


@dataclass
class CheckReport:
    """Everything one rank found; ``ok`` is false if any check failed here."""

    rank: int
    size: int
    local_rank: int
    hostname: str
    device: str
    environment: str
    backends: dict[str, bool] = field(default_factory=dict)
    control_plane: str = ""
    gpus: list[str] = field(default_factory=list)
    results: list[CheckResult] = field(default_factory=list)
    bandwidth: list[BandwidthSample] = field(default_factory=list)
    sites: list[RankSite] = field(default_factory=list)
    links: list[LinkSample] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        """Checks that ran and gave a wrong answer or raised."""
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        """True when no check failed on this rank."""
        return not self.failures

    @property
    def hosts(self) -> list[HostSummary]:
        """The job's hosts in order of their first rank."""
        return summarize_hosts(self.sites)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for ``ringtrain check --json``)."""
        data = asdict(self)
        data["ok"] = self.ok
        data["hosts"] = [asdict(h) for h in self.hosts]
        return data


def summarize_hosts(sites: Sequence[RankSite]) -> list[HostSummary]:
    """Group ranks by host name, in order of first appearance (the first rank speaks for its host)."""
    groups: dict[str, list[RankSite]] = {}
    for site in sites:
        groups.setdefault(site.host, []).append(site)
    return [HostSummary(host, tuple(s.rank for s in members), members[0].interfaces, members[0].clock_offset,
                        members[0].versions) for host, members in groups.items()]



def hello_line(report: CheckReport) -> str:
    """The line every rank prints first."""
    return (f"hello from rank {report.rank} of {report.size} (host {report.hostname}, "
            f"local rank {report.local_rank}, device {report.device})")
