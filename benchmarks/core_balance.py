"""How fast each core trains, and the ceiling that sets for synchronous data-parallel training.

Synchronous training (Horovod, DDP, ringtrain) steps at the pace of its slowest rank; processes that
never communicate each run at their own pace. When the cores of a machine are not equally fast (a VM
whose first vCPU also takes the host's interrupts, say), two synchronous ranks fall short of two
independent processes even with free communication. This script measures that bound:

    python benchmarks/core_balance.py                  # ResNet-18, 3 repeats: about 3 minutes on 2 cores
    python benchmarks/core_balance.py --model mnist_cnn --steps 200

For every repeat it times the training step of one process pinned to each core alone, then of one
process per core at once (the 2-rank situation), all with one thread. From the "at once" times
``t_i`` it reports the ceiling of synchronous over independent throughput,
``n / max(t) / sum(1 / t_i)``: what a synchronous job reaches at best, relative to independent
processes, on these cores. Results: ``benchmarks/results/core_balance_<cpu>_<date>-<time>.{json,md}``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import write_results  # noqa: E402
from step_bench import MODELS, build_model  # noqa: E402


def time_steps(core: int, model_name: str, steps: int, warmup: int, start: Any, out: Any) -> None:
    """Child: pin to ``core``, wait for ``start``, report the median step time (seconds)."""
    import torch

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch, shape, classes = MODELS[model_name]
    model = build_model(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    start.wait()
    times = []
    for i in range(warmup + steps):
        begin = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if i >= warmup:
            times.append(time.perf_counter() - begin)
    out.put((core, statistics.median(times)))


def measure(cores: list[int], model_name: str, steps: int, warmup: int) -> dict[int, float]:
    """Median step time per core, with one process on each of ``cores`` at once."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(cores)), ctx.Queue()
    procs = [ctx.Process(target=time_steps, args=(c, model_name, steps, warmup, start, out)) for c in cores]
    for p in procs:
        p.start()
    try:
        # A child that dies never reports: the timeout turns that into an error instead of a hang.
        results = dict(out.get(timeout=900) for _ in procs)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    failed = {core: p.exitcode for core, p in zip(cores, procs) if p.exitcode != 0}
    if failed:
        raise SystemExit(f"timing processes failed (core: exit code): {failed}")
    return results


def ceiling(times: dict[int, float]) -> float:
    """Synchronous over independent throughput at best: every rank waits for the slowest."""
    return len(times) / max(times.values()) / sum(1.0 / t for t in times.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=12, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or args.steps < 1 or args.repeats < 1:
        parser.error(f"needs at least 2 usable cores (have {cores}) and --steps, --repeats >= 1")
    from ringtrain.bench.machine import describe_machine

    machine = describe_machine()
    repeats = []
    for repeat in range(args.repeats):
        alone = {}
        for core in (cores if repeat % 2 == 0 else cores[::-1]):
            alone.update(measure([core], args.model, args.steps, args.warmup))
        together = measure(cores, args.model, args.steps, args.warmup)
        repeats.append({"alone": alone, "together": together, "ceiling": ceiling(together)})
        print(f"repeat {repeat}: alone {fmt(alone)}; at once {fmt(together)}; "
              f"synchronous ceiling {ceiling(together):.3f}", flush=True)
    ceilings = [r["ceiling"] for r in repeats]
    lines = [f"# Core balance: {machine['date']}", "",
             f"Machine: {machine['cpu']}, {machine['usable_cores']} cores; torch {machine['torch']}, "
             f"ringtrain {machine['ringtrain']} ({machine['commit']}); {machine['os']}.", "",
             f"`benchmarks/core_balance.py --model {args.model} --steps {args.steps} "
             f"--repeats {args.repeats}`: "
             "median training-step time of one single-threaded process pinned to each core, alone and with "
             "one process per core at once. Ceiling: synchronous over independent throughput at best, "
             "`n / max(t) / sum(1 / t_i)` of the at-once times.", "",
             "| repeat | " + " | ".join(f"core {c} alone" for c in cores) + " | "
             + " | ".join(f"core {c} at once" for c in cores) + " | ceiling |",
             "|---" * (2 * len(cores) + 2) + "|"]
    for i, r in enumerate(repeats):
        lines.append(f"| {i} | " + " | ".join(f"{r['alone'][c] * 1e3:.1f} ms" for c in cores) + " | "
                     + " | ".join(f"{r['together'][c] * 1e3:.1f} ms" for c in cores)
                     + f" | {r['ceiling']:.3f} |")
    low, high = min(ceilings), max(ceilings)
    lines += ["", f"Ceiling: median {statistics.median(ceilings):.3f} [{low:.3f}-{high:.3f}].", ""]
    text = "\n".join(lines)
    print(text)
    write_results(args.out, "core_balance", machine, text,
                  {"model": args.model, "steps": args.steps, "repeats": repeats})
    return 0


def fmt(times: dict[int, float]) -> str:
    return ", ".join(f"core {c} {t * 1e3:.1f} ms" for c, t in sorted(times.items()))


if __name__ == "__main__":
    sys.exit(main())
