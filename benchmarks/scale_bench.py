"""World formation at scale: N simulated ranks meet through ringtrain's job store and torch's TCPStore.

Each simulated rank is a thread that does what a rank does at start-up, with the real client of
each store: connect (ringtrain's with its secret handshake), publish its address, add itself to an
arrival count, wait until all have arrived (the last one sets a key), read rank 0's address. The
threads are spread over several client processes (``--procs``); the server runs in a process of its
own, as the launcher or rank 0 hosts it. Both stores run in the same run, alternating, ``--repeats``
times per size; the time is from the moment every client thread is released to the moment the last
one has read rank 0's key.

Besides time it counts, for ringtrain's store, the connections the server accepted, the refusals and
the requests it answered (per rank), and, in the clients, how many ranks had to connect more than
once. Run it alone on the machine::

    python benchmarks/scale_bench.py --sizes 256,1024,4096,16384 --repeats 3

A size needs two descriptors per rank on one machine (client and server ends); the server process
and each client process raise their soft descriptor limit to the hard one (``ulimit -Hn``).

TCPStore looks up the name of every connection's address (for its log lines). Where ``::ffff:127.0.0.1``
has no line in ``/etc/hosts`` that lookup goes to DNS, and a resolver that drops queries stalls a
connection for seconds: the harness warns, and the committed results were taken with
``::ffff:127.0.0.1 localhost`` added to ``/etc/hosts``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from results_io import write_results  # noqa: E402

SECRET = "5" * 64
KINDS = ("ringtrain", "tcpstore")


def _raise_fd_limit() -> None:
    """Soft descriptor limit up to the hard one (what the job store's server does for itself)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ----------------------------------------------------------------------------------------- server
def serve(kind: str) -> None:
    """Host one store; print its port, then its counters once stdin closes."""
    from ringtrain.engine import job_store

    _raise_fd_limit()
    if kind == "ringtrain":
        server = job_store.JobStoreServer(SECRET, host="127.0.0.1")
        port = server.port
    else:
        import datetime

        import torch.distributed as dist

        server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=600),
                               wait_for_workers=False, use_libuv=True)
        port = server.port
    cpu_at_start = time.process_time()
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()
    counts: dict[str, Any] = {"server_cpu_s": round(time.process_time() - cpu_at_start, 3)}
    if kind == "ringtrain":
        # (getattr: the harness also runs against older job stores, which counted only refusals)
        counts |= {name: getattr(server, name, -1)
                   for name in ("accepted", "proven", "refused", "requests", "max_handshakes")}
        server.close()
    print(json.dumps(counts), flush=True)


# ---------------------------------------------------------------------------------------- clients
def clients(kind: str, port: int, first: int, count: int, size: int) -> None:
    """Run ranks ``first .. first+count-1``; print "ready", wait for a line, run, print the result."""
    import datetime

    import torch.distributed as dist

    from ringtrain.engine import job_store

    _raise_fd_limit()
    attempts = threading.local()
    real_connect = socket.create_connection

    def counted_connect(*args: Any, **kwargs: Any) -> socket.socket:
        attempts.n = getattr(attempts, "n", 0) + 1
        return real_connect(*args, **kwargs)

    socket.create_connection = counted_connect  # type: ignore[assignment]  # counts the client's tries
    go = threading.Event()
    finished: list[float] = []
    retried: list[int] = []
    errors: list[str] = []
    stores: list[Any] = []  # every rank holds its connection until all are done, as ranks do
    lock = threading.Lock()

    def rank(r: int) -> None:
        go.wait()
        try:
            if kind == "ringtrain":
                store: Any = job_store.JobStore(f"127.0.0.1:{port}", SECRET, timeout=600.0)
            else:
                store = dist.TCPStore("127.0.0.1", port, None, False,
                                      timeout=datetime.timedelta(seconds=600), use_libuv=True)
            store.set(f"addr/{r}", f"10.{r >> 16 & 255}.{r >> 8 & 255}.{r & 255}:29500")
            if store.add("arrived", 1) == size:
                store.set("all arrived", "1")
            store.get("all arrived")
            store.get("addr/0")
            done = time.monotonic()
            with lock:
                finished.append(done)
                stores.append(store)
                if getattr(attempts, "n", 1) > 1:
                    retried.append(attempts.n - 1)
        except Exception as exc:  # reported to the parent, which fails the size
            with lock:
                errors.append(f"rank {r}: {exc}")

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(first, first + count)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.readline()
    cpu_at_start = time.process_time()
    go.set()
    for t in threads:
        t.join()
    print(json.dumps({"last": max(finished, default=0.0), "cpu_s": time.process_time() - cpu_at_start,
                      "retried": retried, "errors": errors[:5], "failed": len(errors)}), flush=True)
    sys.stdin.readline()  # hold the connections until the parent has every result


# ----------------------------------------------------------------------------------------- parent
def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def one_run(kind: str, size: int, procs: int) -> dict[str, Any]:
    server = _spawn("--serve", kind)
    assert server.stdout is not None
    assert server.stdin is not None
    port = json.loads(server.stdout.readline())["port"]
    share = [size // procs + (1 if i < size % procs else 0) for i in range(procs)]
    starts = [sum(share[:i]) for i in range(procs)]
    workers = [_spawn("--clients", kind, str(port), str(first), str(count), str(size))
               for first, count in zip(starts, share) if count]
    for w in workers:
        assert w.stdout is not None
        if w.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a client process of the {kind} run at {size} did not start")
    began = time.monotonic()
    for w in workers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    results = []
    for w in workers:
        assert w.stdout is not None
        results.append(json.loads(w.stdout.readline()))
    for w in workers:
        assert w.stdin is not None
        w.stdin.close()
        w.wait(timeout=120)
    server.stdin.close()
    counts = json.loads(server.stdout.readline())
    server.wait(timeout=60)
    failed = sum(r["failed"] for r in results)
    if failed:
        raise RuntimeError(f"{failed} ranks of the {kind} run at {size} failed: {results[0]['errors']}")
    retried = [n for r in results for n in r["retried"]]
    return {"seconds": max(r["last"] for r in results) - began,
            "client_cpu_s": round(sum(r["cpu_s"] for r in results), 3), "ranks_retried": len(retried),
            "most_retries": max(retried, default=0), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,1024,4096,16384")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--procs", type=int, default=8, help="client processes (default 8)")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--clients", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print the table, commit nothing")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.clients:
        kind, port, first, count, size = args.clients
        clients(kind, int(port), int(first), int(count), int(size))
        return

    from ringtrain.bench.machine import describe_machine

    try:
        socket.getnameinfo(("::ffff:127.0.0.1", 0, 0, 0), socket.NI_NAMEREQD)
    except OSError:
        print("warning: ::ffff:127.0.0.1 has no name in /etc/hosts: TCPStore's lookups go to DNS and may "
              "stall (see this script's docstring)", file=sys.stderr)
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for size in sizes:
        runs[size] = {kind: [] for kind in KINDS}
        for repeat in range(args.repeats):
            order = KINDS if repeat % 2 == 0 else KINDS[::-1]  # neither always goes first
            for kind in order:
                result = one_run(kind, size, args.procs)
                runs[size][kind].append(result)
                print(f"{size:>6} {kind:<9} {result['seconds']:7.2f} s  "
                      f"{json.dumps({k: v for k, v in result.items() if k != 'seconds'})}", flush=True)

    machine = describe_machine()
    lines = [
        "# World formation at scale: ringtrain's job store against torch's TCPStore", "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores; torch {machine.get('torch')}, "
        f"ringtrain {machine.get('ringtrain')} ({machine.get('commit')}); {machine.get('date')}.", "",
        f"Simulated ranks as threads over {args.procs} client processes, server in its own process, "
        f"both stores in the same run, median of {args.repeats}.", "",
        "| ranks | job store (s) | TCPStore (s) | ratio | server CPU / rank (us): job store, TCPStore "
        "| connections / rank | requests / rank | refusals | ranks that retried |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = []
    for size in sizes:
        ours = runs[size]["ringtrain"]
        theirs = runs[size]["tcpstore"]
        ours_s = statistics.median(r["seconds"] for r in ours)
        theirs_s = statistics.median(r["seconds"] for r in theirs)
        row = {"ranks": size, "job_store_s": ours_s, "tcpstore_s": theirs_s, "ratio": ours_s / theirs_s,
               "connections_per_rank": max(r["accepted"] for r in ours) / size,
               "requests_per_rank": max(r["requests"] for r in ours) / size,
               "refusals": max(r["refused"] for r in ours),
               "ranks_retried": max(r["ranks_retried"] for r in ours),
               "most_retries": max(r["most_retries"] for r in ours),
               "server_cpu_us_per_rank": statistics.median(r["server_cpu_s"] for r in ours) / size * 1e6,
               "tcpstore_server_cpu_us_per_rank":
                   statistics.median(r["server_cpu_s"] for r in theirs) / size * 1e6}
        summary.append(row)
        lines.append(f"| {size} | {ours_s:.2f} | {theirs_s:.2f} | {row['ratio']:.2f}x | "
                     f"{row['server_cpu_us_per_rank']:.0f}, {row['tcpstore_server_cpu_us_per_rank']:.0f} | "
                     f"{row['connections_per_rank']:.2f} | {row['requests_per_rank']:.2f} | "
                     f"{row['refusals']} | {row['ranks_retried']} |")
    lines += ["", "Ratio: the job store's median time over TCPStore's (below 1: the job store is faster). "
              "Connections, requests and refusals are the job store's, counted by its server, the worst "
              "of the repeats; a rank that retried connected more than once.", ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_results(ROOT / "results", "scale_bench", machine, text,
                      {"procs": args.procs, "repeats": args.repeats, "summary": summary,
                       "runs": {str(k): v for k, v in runs.items()}})


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
