"""Self-test of a job: is every collective correct, how fast is allreduce here, and how do its hosts differ?

``ringtrain check`` runs these under any launcher (``ringtrain run``, ``srun``, ``mpirun``,
torchrun, or alone). Every check builds each rank's contribution from a deterministic function of
the rank, so any rank can compute the exact expected result locally and compare it with what the
collective returned; a wrong answer is reported with the first mismatching value, not just "failed".

The checks go through ringtrain's Horovod-compatible API (``import ringtrain as hvd``), never through
``torch.distributed`` directly: the point is to test the stack a training script will use.

Across hosts (:func:`gather_hosts`, :func:`measure_links`, :func:`host_warnings`): every rank reports its
host's network interfaces, the addresses other ranks reached it on, its clock and its versions of
ringtrain, torch and Python; the allreduce bandwidth of each pair of hosts is measured on a process set of
one rank per host; hosts whose versions or clocks differ get a warning.
"""

from __future__ import annotations

import platform
import socket
import statistics
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

import ringtrain

#: Reduce ops checked with allreduce, by their Horovod names.
ALLREDUCE_OPS: tuple[str, ...] = ("Sum", "Average", "Min", "Max", "Product", "Adasum")

#: Default message sizes of the bandwidth sweep, in bytes (float32 payloads).
DEFAULT_BANDWIDTH_SIZES: tuple[int, ...] = (4 << 10, 256 << 10, 4 << 20)

_FLOAT_TOL = {"rtol": 1e-5, "atol": 1e-6}


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
    """Where one rank runs, as it sees it: gathered from every rank by :func:`gather_hosts`."""

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


#: Clocks further apart than this get a warning (logs and timestamps of the hosts stop lining up).
CLOCK_SKEW_WARN_S = 1.0
#: Above this many hosts, links are measured from the first host to each other, not between every pair.
ALL_PAIRS_MAX_HOSTS = 8
_SIOCGIFADDR = 0x8915


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


def load_api() -> ModuleType:
    """ringtrain's Horovod-compatible API: the package itself, as in ``import ringtrain as hvd``."""
    return ringtrain


def backend_availability() -> dict[str, bool]:
    """Which torch.distributed backends this torch build has."""
    return {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
            "mpi": dist.is_mpi_available(), "ucc": dist.is_ucc_available()}


def gpu_names() -> list[str]:
    """Names of the CUDA devices this process can see (empty on CPU-only machines)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def pick_device(requested: str, local_rank: int) -> torch.device:
    """``auto`` means this rank's GPU when there is one, else the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but torch sees no CUDA device. "
                             "HINT: use --device cpu, or install a CUDA build of torch.")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(requested)


def hello_line(report: CheckReport) -> str:
    """The line every rank prints first."""
    return (f"hello from rank {report.rank} of {report.size} (host {report.hostname}, "
            f"local rank {report.local_rank}, device {report.device})")


# --- expected values: a pure function of (rank, size) so every rank can recompute them ----------

def _contribution(rank: int, length: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s allreduce input: small integers, exact in float32, different on each rank."""
    return (torch.arange(length, dtype=torch.float32, device=device) % 7) + rank


def _product_contribution(rank: int, length: int, device: torch.device) -> torch.Tensor:
    """Values near 1, so that a product over many ranks neither overflows nor underflows."""
    return 1.0 + 0.01 * ((torch.arange(length, device=device) + rank) % 5).float()


def _first_mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    """A short description of where ``got`` and ``want`` differ."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    bad = (~torch.isclose(got.double(), want.double(), **_FLOAT_TOL)).nonzero()
    index = tuple(bad[0].tolist())
    return (f"{len(bad)} of {want.numel()} values wrong; first at index {index}: "
            f"got {got[index].item()}, expected {want[index].item()}")


def _compare(name: str, got: Any, want: torch.Tensor) -> CheckResult:
    if not isinstance(got, torch.Tensor):
        return CheckResult(name, False, f"returned {type(got).__name__}, expected a tensor")
    got_cpu, want_cpu = got.detach().cpu(), want.detach().cpu()
    if (got_cpu.shape == want_cpu.shape and got_cpu.dtype == want_cpu.dtype
            and torch.allclose(got_cpu.double(), want_cpu.double(), **_FLOAT_TOL)):
        return CheckResult(name, True)
    return CheckResult(name, False, _first_mismatch(got_cpu, want_cpu))


# --- the checks --------------------------------------------------------------------------------

def check_allreduce(hvd: ModuleType, op_name: str, device: torch.device, length: int = 33) -> CheckResult:
    """allreduce with ``op_name`` (a Horovod op name) against the locally computed reduction."""
    rank, size = hvd.rank(), hvd.size()
    name = f"allreduce[{op_name.lower()}]"
    if op_name == "Adasum":
        # Adasum of mutually orthogonal vectors is their plain sum: one-hot rows give all ones; where
        # ranks are averaged within their host first (CUDA tensors, as Horovod's NCCL build, or
        # hierarchical allreduce), rank r's entry is 1 / (ranks on r's host).
        mine = torch.zeros(size, device=device)
        mine[rank] = 1.0
        want = torch.tensor([1.0 / n for n in _adasum_host_sizes(size, device)], device=device)
    elif op_name == "Product":
        mine = _product_contribution(rank, length, device)
        want = torch.stack([_product_contribution(r, length, device) for r in range(size)]).prod(0)
    else:
        mine = _contribution(rank, length, device)
        stacked = torch.stack([_contribution(r, length, device) for r in range(size)])
        want = {"Sum": lambda: stacked.sum(0), "Average": lambda: stacked.mean(0),
                "Min": lambda: stacked.min(0).values, "Max": lambda: stacked.max(0).values}[op_name]()
    before = mine.clone()
    try:
        got = hvd.allreduce(mine, name=f"check.{name}", op=getattr(hvd, op_name))
    except NotImplementedError as exc:
        return CheckResult(name, True, f"not supported here: {exc}", skipped=True)
    result = _compare(name, got, want)
    if result.ok and not torch.equal(mine, before):
        return CheckResult(name, False, "allreduce changed its input tensor (it must be out-of-place)")
    return result


def _adasum_host_sizes(size: int, device: torch.device) -> list[int]:
    """For each rank, how many ranks Adasum averages it with first (1 where it does not)."""
    from ringtrain.engine import state

    # The engine of this process, when the API checked is ringtrain's own (a stand-in API has none).
    engine = state.engine
    hierarchy = engine.sets[0].extra.get("hierarchy") if engine is not None else None
    index = -1
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    if hierarchy is None or not hierarchy.adasum_by_host(index):
        return [1] * size
    return [next(len(host) for host in hierarchy.hosts if r in host) for r in range(size)]


def check_allreduce_large(hvd: ModuleType, device: torch.device, numel: int = 1 << 20) -> CheckResult:
    """A 4 MiB Sum: large tensors take another path than small ones (the socket ring, gloo or NCCL)."""
    name = "allreduce[large]"
    size = hvd.size()
    got = hvd.allreduce(_contribution(hvd.rank(), numel, device), name=f"check.{name}", op=hvd.Sum)
    # Rank r sends pattern + r, so the sum is size * pattern + (0 + 1 + ... + size - 1).
    return _compare(name, got, _contribution(0, numel, device) * size + size * (size - 1) // 2)


def check_allreduce_int(hvd: ModuleType, device: torch.device) -> CheckResult:
    """Integer Sum: catches a path that silently goes through floats."""
    rank, size = hvd.rank(), hvd.size()
    big = 1 << 40  # not representable exactly in float32 when combined with small values
    mine = torch.tensor([big + rank, rank], dtype=torch.int64, device=device)
    want = torch.tensor([big * size + size * (size - 1) // 2, size * (size - 1) // 2], dtype=torch.int64)
    got = hvd.allreduce(mine, name="check.allreduce[int64]", op=hvd.Sum)
    if isinstance(got, torch.Tensor) and got.dtype == torch.int64 and torch.equal(got.cpu(), want):
        return CheckResult("allreduce[int64]", True)
    shown = got.tolist() if isinstance(got, torch.Tensor) else got
    return CheckResult("allreduce[int64]", False, f"got {shown} ({getattr(got, 'dtype', '?')}), "
                                                  f"expected {want.tolist()} (torch.int64)")


def check_allgather(hvd: ModuleType, device: torch.device) -> CheckResult:
    """allgather where rank r sends r+1 rows: first dimensions differ, as Horovod allows."""
    rank, size = hvd.rank(), hvd.size()

    def rows(r: int) -> torch.Tensor:
        return torch.full((r + 1, 3), float(r), device=device) + torch.arange(3, device=device)

    got = hvd.allgather(rows(rank), name="check.allgather")
    return _compare("allgather[uneven]", got, torch.cat([rows(r) for r in range(size)]))


def check_broadcast(hvd: ModuleType, device: torch.device) -> CheckResult:
    """broadcast from the last rank (a non-zero root catches root mix-ups); input left unchanged."""
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    mine = torch.arange(17, dtype=torch.float32, device=device) * (rank + 1)
    before = mine.clone()
    got = hvd.broadcast(mine, root, name="check.broadcast")
    result = _compare(f"broadcast[root={root}]", got, torch.arange(17, dtype=torch.float32) * (root + 1))
    if result.ok and not torch.equal(mine, before):
        return CheckResult(result.name, False, "broadcast changed its input tensor (it must be out-of-place)")
    return result


def check_alltoall(hvd: ModuleType, device: torch.device) -> list[CheckResult]:
    """alltoall with equal splits, then with uneven per-rank splits (and the received splits)."""
    rank, size = hvd.rank(), hvd.size()
    # Equal: two rows per destination; a row's value says who sent it to whom.
    rows = torch.tensor([[100.0 * rank + d] for d in range(size) for _ in range(2)], device=device)
    got = hvd.alltoall(rows, name="check.alltoall")
    want = torch.tensor([[100.0 * s + rank] for s in range(size) for _ in range(2)])
    results = [_compare("alltoall[equal]", got, want)]

    def count(src: int, dst: int) -> int:
        return (src + dst) % 2 + 1

    splits = [count(rank, d) for d in range(size)]
    rows = torch.tensor([[100.0 * rank + d] for d in range(size) for _ in range(count(rank, d))],
                        device=device)
    out = hvd.alltoall(rows, splits=splits, name="check.alltoall.splits")
    want = torch.tensor([[100.0 * s + rank] for s in range(size) for _ in range(count(s, rank))])
    if not (isinstance(out, tuple) and len(out) == 2):
        results.append(CheckResult("alltoall[splits]", False,
                                   f"returned {type(out).__name__}, expected (output, received_splits)"))
        return results
    got, received = out
    result = _compare("alltoall[splits]", got, want)
    want_received = [count(s, rank) for s in range(size)]
    got_received = torch.as_tensor(received).cpu().tolist()
    if result.ok and got_received != want_received:
        result = CheckResult("alltoall[splits]", False,
                             f"received_splits {got_received}, expected {want_received}")
    results.append(result)
    return results


def check_reducescatter(hvd: ModuleType, op_name: str, device: torch.device) -> CheckResult:
    """reducescatter over 2n+1 rows: the first (rows % n) ranks get one extra row, as in Horovod."""
    rank, size = hvd.rank(), hvd.size()
    nrows = 2 * size + 1

    def contribution(r: int) -> torch.Tensor:
        return torch.arange(nrows * 2, dtype=torch.float32, device=device).reshape(nrows, 2) + r

    total = torch.stack([contribution(r) for r in range(size)]).sum(0)
    if op_name == "Average":
        total = total / size
    counts = [nrows // size + (1 if r < nrows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    got = hvd.reducescatter(contribution(rank), name=f"check.reducescatter.{op_name}",
                            op=getattr(hvd, op_name))
    return _compare(f"reducescatter[{op_name.lower()}]", got, total[start:start + counts[rank]])


def check_barrier(hvd: ModuleType) -> CheckResult:
    """barrier returns on every rank (a hang is caught by the command's timeout)."""
    result = hvd.barrier()
    if result is not None:
        return CheckResult("barrier", False, f"returned {result!r}, expected None")
    return CheckResult("barrier", True)


def _guarded(name: str, fn: Callable[[], CheckResult | list[CheckResult]]) -> list[CheckResult]:
    """Run one check; an exception becomes a failed result that names it."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - any error is a finding to report, not a crash
        return [CheckResult(name, False, f"raised {type(exc).__name__}: {exc}")]
    return result if isinstance(result, list) else [result]


def run_collective_checks(hvd: ModuleType, device: torch.device,
                          progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Every collective, in the same order on every rank; ``progress`` hears each name first."""
    plan: list[tuple[str, Callable[[], CheckResult | list[CheckResult]]]] = []
    for op in ALLREDUCE_OPS:
        plan.append((f"allreduce[{op.lower()}]", lambda op=op: check_allreduce(hvd, op, device)))
    plan += [
        ("allreduce[int64]", lambda: check_allreduce_int(hvd, device)),
        ("allreduce[large]", lambda: check_allreduce_large(hvd, device)),
        ("allgather[uneven]", lambda: check_allgather(hvd, device)),
        ("broadcast", lambda: check_broadcast(hvd, device)),
        ("alltoall", lambda: check_alltoall(hvd, device)),
        ("reducescatter[sum]", lambda: check_reducescatter(hvd, "Sum", device)),
        ("reducescatter[average]", lambda: check_reducescatter(hvd, "Average", device)),
        ("barrier", lambda: check_barrier(hvd)),
    ]
    results: list[CheckResult] = []
    for name, fn in plan:
        if progress is not None:
            progress(name)
        results.extend(_guarded(name, fn))
    return results


def measure_allreduce_bandwidth(hvd: ModuleType, device: torch.device, sizes: Sequence[int],
                                iterations: int = 5) -> list[BandwidthSample]:
    """Median allreduce (Sum) time per message size after one warm-up call, as this rank saw it."""
    size = hvd.size()
    samples = []
    for nbytes in sizes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        name = f"check.bandwidth.{nbytes}"
        hvd.allreduce(tensor, name=name, op=hvd.Sum)  # warm-up: buffers, connections, caches
        times = []
        for _ in range(iterations):
            hvd.barrier()
            start = time.perf_counter()
            hvd.allreduce(tensor, name=name, op=hvd.Sum)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        actual = tensor.numel() * 4
        algbw = actual / seconds / 1e6 if seconds > 0 else float("inf")
        samples.append(BandwidthSample(actual, seconds, algbw, algbw * 2 * (size - 1) / size))
    return samples


def count_failures_everywhere(hvd: ModuleType, local_failures: int) -> int:
    """Sum of failures over all ranks, so every rank exits with the same verdict.

    If that allreduce itself breaks, only this rank's count is known; it is returned plus one so the
    broken reduction is itself counted as a failure.
    """
    try:
        total = hvd.allreduce(torch.tensor([float(local_failures)]), name="check.verdict", op=hvd.Sum)
        return int(round(float(total.sum())))
    except Exception:  # noqa: BLE001 - the verdict must not crash the report
        return local_failures + 1


# --- across hosts ------------------------------------------------------------------------------

def interface_addresses() -> tuple[tuple[str, str], ...]:
    """``(name, IPv4 address)`` of this host's interfaces (Linux ioctl; "" where one has no IPv4)."""
    try:
        import fcntl  # Linux and other Unix systems

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return ()
    found = []
    for name in names:
        address = ""
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            address = socket.inet_ntoa(packed[20:24])
        except OSError:
            pass
        found.append((name, address))
    return tuple(found)


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


def summarize_hosts(sites: Sequence[RankSite]) -> list[HostSummary]:
    """Group ranks by host name, in order of first appearance (the first rank speaks for its host)."""
    groups: dict[str, list[RankSite]] = {}
    for site in sites:
        groups.setdefault(site.host, []).append(site)
    return [HostSummary(host, tuple(s.rank for s in members), members[0].interfaces, members[0].clock_offset,
                        members[0].versions) for host, members in groups.items()]


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


def control_plane_description() -> str:
    """What carries the engine's negotiation rounds (firewalls care: the mesh uses its own ports)."""
    from ringtrain.engine import state
    from ringtrain.engine.control_plane import DEFAULT_MAX_RANKS

    engine = state.engine
    if engine is None or engine.size == 1:
        return "none (one process)"
    if engine.plane is None:
        return f"gloo (RINGTRAIN_CONTROL_PLANE=gloo, or more than {DEFAULT_MAX_RANKS} ranks)"
    arena = engine.groups.arena
    if arena is not None and arena.disabled is None:
        # The arena's segments are set up at the first large allreduce: until then it may still refuse.
        large = "shared memory (all ranks on one host), else ring over the mesh"
    elif arena is not None:
        large = f"ring over the mesh (shared memory is off: {arena.disabled})"
    elif engine.cpu_ring:
        large = "ring over the mesh"
    else:
        large = "gloo (RINGTRAIN_CPU_ALLREDUCE=gloo)"
    return (f"tcp socket mesh ({engine.size - 1} connection(s) per rank, messages up to "
            f"{engine.plane.max_message // 1024} KiB); large CPU allreduces: {large}")


def new_report(hvd: ModuleType, device: torch.device, environment: str) -> CheckReport:
    """The identity part of a report: who and where this rank is."""
    return CheckReport(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                       hostname=socket.gethostname(), device=str(device), environment=environment,
                       backends=backend_availability(), control_plane=control_plane_description(),
                       gpus=gpu_names())
