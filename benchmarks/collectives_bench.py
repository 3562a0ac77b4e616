"""Adasum and hierarchical allreduce: their cost against the flat allreduce and raw torch.distributed.

One command, one run, every competitor in the same processes::

    python benchmarks/collectives_bench.py               # 4 ranks here, as 2 hosts x 2 ranks
    python benchmarks/collectives_bench.py --quick       # a smoke run (seconds)
    python benchmarks/collectives_bench.py --namespaces  # root: 2 ranks on each of two network-namespace
                                                         # hosts (tests/integration/netns.py), 1 Gbit/s link

Every rank allreduces float32 tensors (4 KiB to 32 MiB) with

- ``raw``: ``torch.distributed.all_reduce`` (gloo) on the same processes,
- ``flat``: ``hvd.allreduce_(t, op=hvd.Average)``, the engine's flat allreduce (socket ring),
- ``hierarchical``: the same call with HOROVOD_HIERARCHICAL_ALLREDUCE on (reduce within each host,
  allreduce among one rank per host, broadcast within the host),
- ``adasum``: ``hvd.allreduce_(t, op=hvd.Adasum)``, the pairwise tree over all ranks,
- ``adasum by host``: Adasum with hierarchical allreduce on (average within hosts, Adasum among them).

The hierarchical switch is flipped on every rank at the same point between windows (the engine reads
it per operation), so all five run in the same processes. Timed windows rotate among them (order
reversed every window); ratios are medians over adjacent window pairs with a 95 % bootstrap interval
(``paired.py``). Tensors hold zeros so that repeated in-place calls neither overflow nor change cost.
Results go to ``benchmarks/results/collectives_bench_<cpu>_<date>-<time>.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from allreduce_bench import _human, machine
from paired import bootstrap_ci, pair_ratios

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SIZES = [4 * 1024, 256 * 1024, 4 * 1024 * 1024, 32 * 1024 * 1024]
QUICK_SIZES = [4 * 1024, 1024 * 1024]
COMPETITORS = ["raw", "flat", "hierarchical", "adasum", "adasum_by_host"]
#: (numerator, denominator) of the ratios reported for every size.
RATIOS = [("hierarchical", "flat"), ("hierarchical", "raw"), ("flat", "raw"), ("adasum", "flat"),
          ("adasum_by_host", "flat"), ("adasum_by_host", "adasum")]


def calls_for(nbytes: int, quick: bool) -> int:
    calls = 100 if nbytes <= 64 * 1024 else 20 if nbytes <= 1024 * 1024 else 5 if nbytes <= 8 << 20 else 2
    return max(1, calls // 4) if quick else calls


def _hierarchical(on: bool) -> None:
    """Switch hierarchical allreduce on or off in this rank's engine (every rank does it at once)."""
    from ringtrain.engine import state

    for groups in state.require().sets.values():
        hierarchy = groups.extra.get("hierarchy")
        if hierarchy is not None:
            hierarchy.topology = dataclasses.replace(hierarchy.topology, allreduce=on)


def _window(fn: Callable[[], None], calls: int, hierarchical: bool) -> float:
    _hierarchical(hierarchical)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(args: argparse.Namespace) -> dict[str, Any] | None:
    """Run in every rank (torch.distributed variables set); rank 0 returns the timings."""
    import ringtrain.mpi_ops as hvd
    from ringtrain.engine import state

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hvd.init()  # shares torch.distributed's store; its groups are its own
    hierarchy = state.require().sets[0].extra["hierarchy"]
    rows = []
    for nbytes in args.sizes:
        tensor = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
        calls = calls_for(nbytes, args.quick)
        runs: dict[str, tuple[Callable[[], None], bool]] = {
            "raw": (lambda t=tensor: dist.all_reduce(t), False),
            "flat": (lambda t=tensor, n=nbytes: hvd.allreduce_(t, name=f"flat.{n}", op=hvd.Average), False),
            "hierarchical": (lambda t=tensor, n=nbytes: hvd.allreduce_(t, name=f"hier.{n}", op=hvd.Average),
                             True),
            "adasum": (lambda t=tensor, n=nbytes: hvd.allreduce_(t, name=f"ada.{n}", op=hvd.Adasum), False),
            "adasum_by_host": (lambda t=tensor, n=nbytes: hvd.allreduce_(t, name=f"adah.{n}", op=hvd.Adasum),
                               True),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for fn, on in runs.values():  # warm-up: connections, groups, caches, allocator
            _window(fn, max(1, calls // 2), on)
        order = list(runs)
        for window in range(args.windows):
            for name in order if window % 2 == 0 else order[::-1]:
                fn, on = runs[name]
                times[name].append(_window(fn, calls, on))
        rows.append({"bytes": nbytes, "calls_per_window": calls, "times_s": times})
    layout = hierarchy.hosts
    rank = hvd.rank()
    hvd.shutdown()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {"rows": rows, "hosts": layout, "ranks": len(sum(layout, []))}


def summarize(result: dict[str, Any], args: argparse.Namespace, link: str) -> dict[str, Any]:
    sizes = []
    for row in result["rows"]:
        times = row["times_s"]
        entry: dict[str, Any] = {"bytes": row["bytes"], "calls_per_window": row["calls_per_window"],
                                 "windows": len(times["raw"])}
        for name in COMPETITORS:
            entry[f"{name}_latency_us"] = {"median": statistics.median(times[name]) * 1e6,
                                           "min": min(times[name]) * 1e6, "max": max(times[name]) * 1e6}
        for ours, theirs in RATIOS:
            ratios = pair_ratios(times[ours], times[theirs])
            entry[f"{ours}_vs_{theirs}"] = {"median": statistics.median(ratios),
                                            "ci95": list(bootstrap_ci(ratios))}
        sizes.append(entry)
    return {
        "benchmark": "collectives_bench",
        "machine": machine(),
        "setup": {"ranks": result["ranks"], "hosts": result["hosts"], "link": link, "threads_per_rank": 1,
                  "dtype": "float32", "windows": args.windows, "quick": args.quick,
                  "calls": "hvd.allreduce_(t, op=hvd.Average | hvd.Adasum) (synchronous); "
                           "torch.distributed.all_reduce(t) (gloo)"},
        "sizes": sizes,
    }


def markdown(report: dict[str, Any]) -> str:
    m, setup = report["machine"], report["setup"]
    lines = [
        "# Adasum and hierarchical allreduce vs the flat allreduce and raw torch.distributed",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores; {m['platform']}",
        f"- torch {m['torch']}, Python {m['python']}; measured {m['date']}",
        f"- {setup['ranks']} ranks x 1 thread on hosts {setup['hosts']} ({setup['link']}), float32; "
        f"{setup['windows']} windows per size rotating among the competitors; latency per call is the "
        "median (min-max) over windows; ratios are medians over adjacent window pairs [95 % bootstrap].",
        "",
        "| size | raw (us) | flat (us) | hierarchical (us) | adasum (us) | adasum by host (us) "
        "| hierarchical / flat | hierarchical / raw | adasum / flat | adasum by host / flat |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def latency(row: dict[str, Any], name: str) -> str:
        cell = row[f"{name}_latency_us"]
        return f"{cell['median']:.0f} ({cell['min']:.0f}-{cell['max']:.0f})"

    def ratio(row: dict[str, Any], key: str) -> str:
        cell = row[key]
        return f"{cell['median']:.2f} [{cell['ci95'][0]:.2f}-{cell['ci95'][1]:.2f}]"

    for row in report["sizes"]:
        cells = [latency(row, name) for name in COMPETITORS]
        cells += [ratio(row, key) for key in ("hierarchical_vs_flat", "hierarchical_vs_raw", "adasum_vs_flat",
                                               "adasum_by_host_vs_flat")]
        lines.append(f"| {_human(row['bytes'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Below 1: faster than the denominator. Hierarchical pays off where the link between hosts is "
        "much slower than inside a host (the namespace run), not among processes of one machine. "
        "Adasum's extra work: float64 dot products and combination per tensor, log2(ranks) pairwise "
        "steps that each move the whole vector.",
        "",
    ]
    return "\n".join(lines)


def _local_rank_worker(rank: int, args: argparse.Namespace, port: int, queue: Any) -> None:
    host, per_host = divmod(rank, args.ranks_per_host)
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(args.ranks), "LOCAL_RANK": str(per_host),
        "LOCAL_WORLD_SIZE": str(args.ranks_per_host), "GROUP_RANK": str(host),
        "GROUP_WORLD_SIZE": str(args.ranks // args.ranks_per_host), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    })
    queue.put((rank, measure(args)))


def run_local(args: argparse.Namespace) -> dict[str, Any]:
    """Spawn the ranks here; fake hosts through GROUP_RANK (the engine groups ranks by node rank)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_local_rank_worker, args=(r, args, port, queue)) for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    results = {}
    try:
        for _ in procs:
            rank, result = queue.get(timeout=3600)
            results[rank] = result
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return results[0]


def run_namespaces(args: argparse.Namespace) -> dict[str, Any]:
    """Two namespace hosts (root), ``ringtrain run -H hostA:k,hostB:k`` from hostA, this script inside."""
    sys.path.insert(0, str(ROOT))
    from tests.integration.netns import start_hosts

    with tempfile.TemporaryDirectory() as folder:
        hosts = start_hosts(Path(folder), bandwidth=args.bandwidth)
        try:
            out = Path(folder) / "rank0.json"
            k = args.ranks_per_host
            argv = [sys.executable, "-m", "ringtrain", "run", "-np", str(2 * k), "-H", f"hostA:{k},hostB:{k}",
                    "-i", str(hosts.key), "--start-timeout", "120", sys.executable,
                    str(Path(__file__).resolve()), "--launched", str(out), "--windows", str(args.windows),
                    "--sizes", ",".join(str(s) for s in args.sizes)] + (["--quick"] if args.quick else [])
            done = hosts.run("hostA", argv, timeout=7200, cwd=ROOT)
            if done.returncode != 0:
                raise SystemExit(f"the namespace run failed:\n{done.stdout}\n{done.stderr}")
            return json.loads(out.read_text())
        finally:
            hosts.stop()


def _size_list(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: give byte counts like 4096,1048576") from None
    if not sizes or min(sizes) < 4:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: each size must be at least 4 bytes")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, few calls: a smoke run")
    parser.add_argument("--windows", type=int, default=None,
                        help="timed windows per size (default 11, quick 3)")
    parser.add_argument("--sizes", type=_size_list, default=None, help="comma-separated byte counts")
    parser.add_argument("--ranks", type=int, default=4, help="ranks spawned here (default 4)")
    parser.add_argument("--ranks-per-host", type=int, default=2, help="ranks per (fake) host (default 2)")
    parser.add_argument("--namespaces", action="store_true",
                        help="run on two network-namespace hosts (needs root, ip, tc, sshd)")
    parser.add_argument("--bandwidth", default="1gbit", help="link between the namespace hosts (tc tbf rate)")
    parser.add_argument("--launched", type=Path, default=None, help=argparse.SUPPRESS)  # inside ringtrain run
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and Markdown report")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    args.windows = args.windows or (3 if args.quick else 11)
    if args.launched is not None:
        result = measure(args)
        if result is not None:
            tmp = args.launched.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            os.replace(tmp, args.launched)
        return 0
    if args.ranks % args.ranks_per_host:
        parser.error(f"--ranks {args.ranks} is not a multiple of --ranks-per-host {args.ranks_per_host}")
    if args.namespaces:
        result, link = run_namespaces(args), f"two network-namespace hosts, veth limited to {args.bandwidth}"
    else:
        result, link = run_local(args), "one machine, fake hosts via GROUP_RANK, loopback"
    report = summarize(result, args, link)
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = re.sub(r"[^A-Za-z0-9]+", "-", report["machine"]["cpu"]).strip("-").lower()[:40]
    where = "_namespaces" if args.namespaces else ""
    stamp = f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M}"
    stem = f"collectives_bench_{cpu}_{stamp}{where}" + ("_quick" if args.quick else "")
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    print(f"wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
