"""Sharded optimizer state against torch's ZeroRedundancyOptimizer: memory and step throughput, 2 ranks.

A model of about 100 M parameters (an MLP of ten 3,162 x 3,162 layers, fp32), Adam, synthetic batches of
8, two ranks of one thread on this machine (gloo, as `ringtrain run -np 2` starts them). Four
configurations, each its own job (a fresh process tree, so that each has its own peak memory), in
interleaved repeats:

- ``unsharded``: ``hvd.DistributedOptimizer(Adam)``;
- ``sharded``: ``hvd.DistributedOptimizer(Adam, shard_optimizer_state=True)``;
- ``zero``: torch DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer(Adam)`` (the competitor);
- ``ddp``: torch DDP with Adam, unsharded (a reference).

Every rank reports its optimizer-state bytes (the tensors of its optimizer's ``state``), its peak
resident memory (``VmHWM`` of /proc/self/status: everything the process touched, the shared memory it
maps included) and its private memory at the end (``Private_*`` of /proc/self/smaps_rollup), and the
time of each step after the warm-up. Throughput ratios are taken per repeat (adjacent jobs) and given
as the median with a 95 % bootstrap interval. Run it alone on the machine (about 10 minutes)::

    .venv/bin/python benchmarks/shard_bench.py --repeats 3

Results: ``benchmarks/results/shard_bench_<cpu>_<date>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from paired import bootstrap_ci, pair_ratios  # noqa: E402
from results_io import write_results  # noqa: E402

CONFIGS = ("unsharded", "sharded", "zero", "ddp")
WIDTH, LAYERS, BATCH = 3162, 10, 8


def _status(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _private_bytes() -> int:
    total = 0
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def _state_bytes(optimizer: Any) -> int:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    return sum(t.numel() * t.element_size() for state in inner.state.values() for t in state.values()
               if hasattr(t, "numel") and getattr(t, "dim", lambda: 0)() > 0)


def rank_mode(config: str, steps: int, warmup: int, out: str) -> int:
    """One rank of one configuration's job."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    parameters = sum(p.numel() for p in model.parameters())
    if config in ("unsharded", "sharded"):
        import ringtrain as hvd

        hvd.init()
        rank = hvd.rank()
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                             named_parameters=model.named_parameters(),
                                             shard_optimizer_state=config == "sharded")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        train_model: nn.Module = model
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        train_model = DistributedDataParallel(model)
        if config == "zero":
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                                lr=1e-4)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(BATCH, WIDTH, generator=generator)
    y = torch.randn(BATCH, WIDTH, generator=generator)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(train_model(x), y).backward()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    report = {"config": config, "rank": rank, "parameters": parameters,
              "state_bytes": _state_bytes(optimizer), "peak_rss": _status("VmHWM"),
              "private_end": _private_bytes(), "step_s": times,
              "checksum": float(sum(p.detach().double().sum() for p in model.parameters()))}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(report))
    if config in ("unsharded", "sharded"):
        import ringtrain as hvd

        hvd.shutdown()
    else:
        dist.destroy_process_group()
    return 0


def run_job(config: str, steps: int, warmup: int, folder: Path, index: int) -> list[dict[str, Any]]:
    out = folder / f"job-{index:03d}-{config}"
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2", sys.executable, __file__, "--rank-mode",
            config, "--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(f"{out}.log", "w") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=1800).returncode
    if code != 0:
        raise SystemExit(f"shard_bench: the {config} job failed (exit {code}); see {out}.log")
    return [json.loads(Path(f"{out}.rank{rank}.json").read_text()) for rank in (0, 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved repeats of every configuration (3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per job (10)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per job (3)")
    parser.add_argument("--rank-mode", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_mode:
        return rank_mode(args.rank_mode, args.steps, args.warmup, args.out)
    import tempfile

    from ringtrain.bench.machine import describe_machine

    folder = Path(tempfile.mkdtemp(prefix="shard-bench-"))
    jobs: dict[str, list[list[dict[str, Any]]]] = {c: [] for c in CONFIGS}
    index = 0
    for repeat in range(args.repeats):
        for config in CONFIGS:
            print(f"repeat {repeat + 1}: {config}", flush=True)
            jobs[config].append(run_job(config, args.steps, args.warmup, folder, index))
            index += 1

    def throughput(job: list[dict[str, Any]]) -> float:
        # the slower rank's median step sets the pace of both
        return 1.0 / max(statistics.median(r["step_s"]) for r in job)

    rows = []
    for config in CONFIGS:
        ranks = [r for job in jobs[config] for r in job]
        rows.append({"config": config, "parameters": ranks[0]["parameters"],
                     "state_mb": max(r["state_bytes"] for r in ranks) / 1e6,
                     "peak_rss_mb": max(r["peak_rss"] for r in ranks) / 1e6,
                     "private_end_mb": max(r["private_end"] for r in ranks) / 1e6,
                     "step_s": statistics.median(1.0 / throughput(job) for job in jobs[config])})
    by = {row["config"]: row for row in rows}
    comparisons = []
    pairs = (("sharded", "zero"), ("sharded", "unsharded"), ("unsharded", "ddp"), ("zero", "ddp"))
    for ours, theirs in pairs:
        ratios = pair_ratios([throughput(j) for j in jobs[ours]], [throughput(j) for j in jobs[theirs]])
        low, high = bootstrap_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0])
        comparisons.append({"ours": ours, "theirs": theirs, "median": statistics.median(ratios), "low": low,
                            "high": high, "pairs": len(ratios)})
    machine = describe_machine()
    lines = ["# Sharded optimizer state against torch's ZeroRedundancyOptimizer", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores; torch {machine.get('torch')}, "
             f"ringtrain {machine.get('ringtrain')} ({machine.get('commit')}); {machine.get('date')}.",
             f"Command: `benchmarks/shard_bench.py {' '.join(sys.argv[1:])}`; 2 ranks x 1 thread (gloo), "
             "an MLP "
             f"of {LAYERS} {WIDTH} x {WIDTH} layers ({rows[0]['parameters'] / 1e6:.1f} M parameters), Adam, "
             f"batch {BATCH}; {args.repeats} interleaved repeat(s), {args.steps} timed steps after "
             f"{args.warmup}.", "",
             "| configuration | optimizer state per rank | vs unsharded | peak RSS per rank "
             "| private memory at the end | time per step |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        ratio = row["state_mb"] / by["unsharded"]["state_mb"] if by["unsharded"]["state_mb"] else float("nan")
        lines.append(f"| {row['config']} | {row['state_mb']:.0f} MB | {ratio:.2f}x | "
                     f"{row['peak_rss_mb']:.0f} MB | {row['private_end_mb']:.0f} MB | "
                     f"{row['step_s'] * 1e3:.0f} ms |")
    lines += ["", "Throughput ratios (per repeat, adjacent jobs; median [95 % bootstrap interval]):", ""]
    lines += [f"- {c['ours']} / {c['theirs']}: {c['median']:.3f}x [{c['low']:.3f}-{c['high']:.3f}] "
              f"({c['pairs']} pairs)" for c in comparisons]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(ROOT / "results", "shard_bench", machine, text,
                  {"rows": rows, "comparisons": comparisons, "jobs": jobs, "argv": sys.argv[1:]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
