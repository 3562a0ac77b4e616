"""The rendezvous at 1,000 nodes: what the node agents' steady polling costs node 0's job store.

While a multi-node job trains, every node's agent keeps talking to node 0's job store (ringtrain's
rendezvous handler, ``launch/rendezvous.py``): a heartbeat counter, torch's agent asking every 0.1 s
whether a node waits in the next round, a look at whether the rendezvous was closed. This harness
starts N real handlers (``RingtrainRendezvous``, each with its own connections, its heartbeat thread
and a thread that asks ``num_nodes_waiting()`` every 0.1 s as torch's agent does) spread over a few
client processes, against a job store in a process of its own, and measures over a window of
``--seconds`` the store's CPU (as a share of one core) and the requests it answered a second::

    python benchmarks/rendezvous_load.py --nodes 1000 --seconds 20

On a 2-core machine the agents' own threads compete with the store for the cores: where the clients
saturate them, the store's share is a lower bound of what it would take on a host of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from results_io import write_results  # noqa: E402
from scale_bench import _raise_fd_limit  # noqa: E402

SECRET = "7" * 64
ASK_EVERY_S = 0.1  # torch's agent: monitor_interval as ringtrain run sets it


def serve() -> None:
    """Host the job store; print its port, then its CPU time and requests at each line of stdin."""
    from ringtrain.engine import job_store

    _raise_fd_limit()
    server = job_store.JobStoreServer(SECRET, host="127.0.0.1")
    print(json.dumps({"port": server.port}), flush=True)
    for _ in sys.stdin:
        print(json.dumps({"cpu_s": time.process_time(), "at": time.monotonic(),
                          "requests": getattr(server, "requests", -1)}), flush=True)
    server.close()


def agents(port: int, first: int, count: int, nnodes: int) -> None:
    """Run the handlers of nodes ``first .. first+count-1`` until stdin closes."""
    from ringtrain.engine.job_store import JobStore
    from ringtrain.launch.rendezvous import NodeView, RingtrainRendezvous

    _raise_fd_limit()
    stop = threading.Event()
    handlers = []
    threading.stack_size(256 * 1024)
    for node in range(first, first + count):
        store = JobStore(f"127.0.0.1:{port}", SECRET, timeout=120.0)
        view = NodeView.here(node_rank=node, nnodes=nnodes, nproc=1, run_id="load", port=port,
                             host=f"node{node}")
        handler = RingtrainRendezvous(store, view, bootstrap_host="127.0.0.1", timeout=600.0)
        handler.round = 0  # as after the first rendezvous: the job trains
        handler._start_heartbeat()
        handlers.append(handler)

        def ask(h: RingtrainRendezvous = handler) -> None:
            while not stop.wait(ASK_EVERY_S):
                h.num_nodes_waiting()

        threading.Thread(target=ask, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    for handler in handlers:
        handler.shutdown()


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def measure(nnodes: int, seconds: float, procs: int) -> dict[str, Any]:
    server = _spawn("--serve")
    assert server.stdout is not None
    assert server.stdin is not None
    port = json.loads(server.stdout.readline())["port"]
    share = [nnodes // procs + (1 if i < nnodes % procs else 0) for i in range(procs)]
    starts = [sum(share[:i]) for i in range(procs)]
    workers = [_spawn("--agents", str(port), str(first), str(count), str(nnodes))
               for first, count in zip(starts, share) if count]
    for w in workers:
        assert w.stdout is not None
        if w.stdout.readline().strip() != "ready":
            raise RuntimeError("an agent process did not start")

    def stats() -> dict[str, Any]:
        assert server.stdin is not None
        assert server.stdout is not None
        server.stdin.write("stats\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline())

    time.sleep(2.0)  # every agent past its first calls
    before = stats()
    time.sleep(seconds)
    after = stats()
    for w in workers:
        assert w.stdin is not None
        w.stdin.close()
    for w in workers:
        w.wait(timeout=120)
    server.stdin.close()
    server.wait(timeout=60)
    wall = after["at"] - before["at"]
    requests = after["requests"] - before["requests"] if before["requests"] >= 0 else None
    return {"nodes": nnodes, "window_s": round(wall, 2),
            "store_core_share": (after["cpu_s"] - before["cpu_s"]) / wall,
            "requests_per_s": None if requests is None else requests / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="16,100,1000")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agents", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print the table, commit nothing")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.agents:
        port, first, count, nnodes = (int(a) for a in args.agents)
        agents(port, first, count, nnodes)
        return

    from ringtrain.bench.machine import describe_machine

    rows = []
    for nnodes in (int(n) for n in args.nodes.split(",")):
        row = measure(nnodes, args.seconds, args.procs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    machine = describe_machine()
    lines = ["# The rendezvous: node 0's job store under the agents' steady polling", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores; torch {machine.get('torch')}, "
             f"ringtrain {machine.get('ringtrain')} ({machine.get('commit')}); {machine.get('date')}.", "",
             f"N real rendezvous handlers over {args.procs} client processes, "
             f"a window of {args.seconds:g} s.",
             "", "| nodes | store CPU (share of one core) | requests / s |", "|---:|---:|---:|"]
    for row in rows:
        rate = "-" if row["requests_per_s"] is None else f"{row['requests_per_s']:.0f}"
        lines.append(f"| {row['nodes']} | {100 * row['store_core_share']:.1f} % | {rate} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_results(ROOT / "results", "rendezvous_load", machine, text,
                      {"seconds": args.seconds, "procs": args.procs, "rows": rows})


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
