"""``ringtrain check``: is this job wired correctly? Hello from every rank, every collective checked,
allreduce bandwidth measured, and across hosts: each host's interfaces, the address each rank is reached
on, the bandwidth of each link between hosts, and clocks or versions that differ (a warning). Runs under
any launcher, or alone as a world of one.

Exit code 0 when every check passed on every rank, 1 when any failed, 3 when the job hung past
``--timeout`` (a rank that never arrives is the most common way distributed jobs go wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from ringtrain.exceptions import UsageError

EXIT_FAILED = 1
EXIT_TIMEOUT = 3


def register(subparsers: Any) -> None:
    """Add the ``check`` subcommand."""
    parser = subparsers.add_parser(
        "check", help="check that every rank can talk to every other and the collectives are correct",
        description="Print a hello from every rank, check each collective (allreduce with every op, "
                    "allgather, broadcast, alltoall, reducescatter, barrier) for a correct result, "
                    "measure allreduce bandwidth, and report every host: its interfaces, the address each "
                    "rank is reached on, the bandwidth between each pair of hosts (the largest --sizes "
                    "entry), and clocks or ringtrain/torch versions that differ. Run it under your launcher: "
                    "`ringtrain run -np 2 ringtrain check`, `srun -n 2 ringtrain check`, "
                    "`mpirun -np 2 ringtrain check`, or alone.")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the test tensors live (default: this rank's GPU if any, else CPU)")
    parser.add_argument("--sizes", default=None, metavar="BYTES[,BYTES...]",
                        help="allreduce message sizes for the bandwidth sweep, with optional K/M/G "
                             "suffix (default: 4K,256K,4M)")
    parser.add_argument("--iterations", type=int, default=5,
                        help="timed allreduces per size; the median is reported (default: 5)")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth sweep")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help=f"seconds before a hanging check is reported and the rank exits {EXIT_TIMEOUT} "
                             "(default: 300)")
    parser.add_argument("--json", action="store_true",
                        help="rank 0 prints one JSON document instead of text (others print failures only)")
    parser.set_defaults(func=run)


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """``"4K,1M"`` -> ``(4096, 1048576)``; a clear UsageError for anything else."""
    from ringtrain.check import DEFAULT_BANDWIDTH_SIZES

    if text is None:
        return DEFAULT_BANDWIDTH_SIZES
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("B")
        number, unit = (item[:-1], item[-1]) if item and item[-1] in units else (item, "")
        try:
            value = int(number) * units[unit]
        except ValueError:
            raise UsageError(f"--sizes {text!r}: {item!r} is not a size. "
                             "HINT: give bytes with an optional K/M/G suffix, e.g. --sizes 4K,1M,16M"
                             ) from None
        if value < 4:
            raise UsageError(f"--sizes {text!r}: {value} bytes is smaller than one float32. "
                             "HINT: use sizes of at least 4 bytes.")
        sizes.append(value)
    return tuple(sizes)


class _Watchdog:
    """Ends the process if the checks hang: a collective waiting for a rank that never comes."""

    def __init__(self, seconds: float, rank_label: str) -> None:
        self.current = "start-up"
        self._label = rank_label
        self._timer = threading.Timer(seconds, self._fire, args=(seconds,))
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _fire(self, seconds: float) -> None:
        print(f"ringtrain check: {self._label}: TIMEOUT after {seconds:g}s while running {self.current}: "
              "some rank did not take part. HINT: check that every rank started (the hello lines) and "
              "that the ranks can reach the main address; raise --timeout on a slow machine.",
              file=sys.stderr, flush=True)
        os._exit(EXIT_TIMEOUT)


def run(args: argparse.Namespace) -> int:
    """Run every check on this rank and print the report; returns the exit code."""
    sizes = () if args.no_bandwidth else parse_sizes(args.sizes)
    if args.iterations < 1:
        raise UsageError(f"--iterations {args.iterations}: need at least 1. HINT: --iterations 5")
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: must be positive. HINT: --timeout 300")

    import torch

    from ringtrain import check as checks
    from ringtrain.env import detect_environment

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    placement = detect_environment().placement()
    where = (f"{placement.environment} environment, rank {placement.rank} of {placement.world_size}, "
             f"main address {placement.main_address}:{placement.main_port}")
    watchdog = _Watchdog(args.timeout, f"rank {placement.rank} ({where})")
    watchdog.start()
    try:
        hvd = checks.load_api()
        watchdog.current = "init"
        try:
            hvd.init(process_sets="dynamic")  # the link measurements pair up hosts in process sets
        except Exception as exc:  # a job that cannot start is the finding to report
            print(f"ringtrain check: rank {placement.rank}: FAIL init ({where}): {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            return EXIT_FAILED
        try:
            device = checks.pick_device(args.device, hvd.local_rank())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        report = checks.new_report(hvd, device, placement.environment)
        if not args.json:
            print(checks.hello_line(report), flush=True)
        if (hvd.rank(), hvd.size()) != (placement.rank, placement.world_size):
            report.results.append(checks.CheckResult(
                "placement", False, f"ringtrain says rank {hvd.rank()} of {hvd.size()} but the "
                f"{placement.environment} environment says rank {placement.rank} of {placement.world_size}"))

        def progress(name: str) -> None:
            watchdog.current = name

        report.results.extend(checks.run_collective_checks(hvd, device, progress))
        if sizes:
            watchdog.current = "bandwidth sweep"
            try:
                report.bandwidth = checks.measure_allreduce_bandwidth(hvd, device, sizes, args.iterations)
            except Exception as exc:  # reported like any other failed check
                report.results.append(checks.CheckResult("bandwidth", False,
                                                         f"raised {type(exc).__name__}: {exc}"))
        watchdog.current = "hosts"
        try:
            report.sites = checks.gather_hosts(hvd)
            if sizes and len(report.hosts) > 1:
                report.links = checks.measure_links(hvd, report.sites, max(sizes), args.iterations, progress)
            report.warnings = checks.host_warnings(report.sites)
        except Exception as exc:  # reported like any other failed check
            report.results.append(checks.CheckResult("hosts", False, f"raised {type(exc).__name__}: {exc}"))
        watchdog.current = "verdict"
        total_failures = checks.count_failures_everywhere(hvd, len(report.failures))
        _print_report(report, total_failures, args.json)
        hvd.shutdown()
    finally:
        watchdog.cancel()
    return 0 if total_failures == 0 and report.ok else EXIT_FAILED


def _print_report(report: Any, total_failures: int, as_json: bool) -> None:
    label = f"rank {report.rank}"
    for failure in report.failures:
        print(f"{label}: FAIL {failure.name}: {failure.detail}", file=sys.stderr, flush=True)
    if report.rank != 0:
        return
    if as_json:
        data = report.to_dict()
        data["failures_all_ranks"] = total_failures
        print(json.dumps(data, indent=2), flush=True)
        return
    lines = [f"environment: {report.environment}, {report.size} rank(s)",
             "backends: " + ", ".join(f"{name} {'yes' if ok else 'no'}"
                                      for name, ok in report.backends.items()),
             f"control plane: {report.control_plane}",
             "gpus: " + (", ".join(f"{i}: {name}" for i, name in enumerate(report.gpus)) or "none")]
    for result in report.results:
        status = "skip" if result.skipped else ("ok" if result.ok else "FAIL")
        lines.append(f"  {result.name:<24} {status}" + (f"  ({result.detail})" if result.detail else ""))
    if report.bandwidth:
        lines.append(f"allreduce bandwidth ({report.size} ranks, {report.device}, median of timed runs):")
        lines.append(f"  {'size':>10}  {'time ms':>9}  {'algbw MB/s':>11}  {'busbw MB/s':>11}")
        for s in report.bandwidth:
            lines.append(f"  {_human(s.nbytes):>10}  {s.seconds * 1e3:>9.3f}  {s.algbw_mbps:>11.1f}  "
                         f"{s.busbw_mbps:>11.1f}")
    lines += _host_lines(report)
    lines += [f"WARNING: {warning}" for warning in report.warnings]
    if total_failures:
        lines.append(f"FAILED: {total_failures} check(s) failed across all ranks (see the FAIL lines)")
    else:
        lines.append(f"all checks passed on {report.size} rank(s)")
    print("\n".join(lines), flush=True)


def _host_lines(report: Any) -> list[str]:
    """Hosts, the addresses ranks are reached on, and links between hosts (rank 0's report)."""
    from ringtrain.check import reached_on

    hosts = report.hosts
    if not hosts:
        return []
    lines = [f"hosts: {len(hosts)}"]
    for host in hosts:
        versions = ", ".join(f"{name} {version}" for name, version in host.versions.items())
        clock = f", clock {host.clock_offset:+.3f} s vs {hosts[0].host}" if host is not hosts[0] else ""
        lines.append(f"  {host.host}: ranks {_ranges(host.ranks)}; {versions}{clock}")
        nics = ", ".join(f"{name} {address or '(no IPv4)'}" for name, address in host.interfaces)
        lines.append(f"    interfaces: {nics or 'unknown'}")
    if len(hosts) > 1:
        lines.append("reached on (the address ranks of other hosts connected to):")
        for site in report.sites:
            addresses = reached_on(report.sites, site.rank)
            gloo = f"; GLOO_SOCKET_IFNAME={site.gloo_ifname}" if site.gloo_ifname else ""
            lines.append(f"  rank {site.rank} ({site.host}): "
                         f"{', '.join(addresses) or 'unknown (no socket mesh)'}{gloo}")
    if report.links:
        sample = report.links[0]
        lines.append(f"links (allreduce between one rank per host, {_human(sample.nbytes)}, median of timed "
                     "runs):")
        for link in report.links:
            lines.append(f"  {link.host_a} <-> {link.host_b}  {link.mbps:10.1f} MB/s  "
                         f"({link.seconds * 1e3:.3f} ms)")
    return lines


def _ranges(ranks: Any) -> str:
    """``(0, 1, 2, 5)`` -> ``0-2,5``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and runs[-1][-1] + 1 == rank:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
