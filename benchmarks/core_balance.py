"""How fast each core trains, and the ceiling that sets for synchronous data-parallel training.

Synchronous training (Horovod, DDP, ringtrain) steps at the pace of its slowest rank; processes that
never communicate each run at their own pace. When the cores of a machine are not equally fast (a VM
whose first vCPU also takes the host's interrupts, say), two synchronous ranks fall short of two
independent processes even with free communication. This script measures that bound:

    python benchmarks/core_balance.py                  # ResNet-18, 3 repeats: about 3 minutes on 2 cores
    python benchmarks/core_balance.py --model mnist_cnn --steps 200

For every repeat it times the training step of one process pinned to each core alone, then of one
process per core at once (the 2-rank situation), all with one thread. It reports two ceilings of
synchronous over independent throughput, each what a synchronous job with free communication
reaches at best:

- **balance**, ``n / max(t) / sum(1 / t_i)`` of the at-once median step times ``t_i``: the cost of
  unequal cores, the job stepping at the slower core's median pace;
- **lockstep**, from every step: a synchronous job's step ``k`` lasts as long as the slowest rank's
  step ``k``, so over ``S`` steps it takes ``sum_k max_r t_rk`` where the processes take
  ``sum_k t_rk`` each. Step-to-step jitter, which independent processes average out, costs a
  synchronous job at every step. (Pairing the ``k``-th steps of processes that drift out of phase
  assumes the jitter is independent from step to step, which the step times bear out on this VM.)

and, comparable with ``ringtrain bench``'s 2-process efficiency, the lockstep throughput over ``n``
times that of one process alone: the best efficiency against one process that any synchronous method
reaches on these cores. Results: ``benchmarks/results/core_balance_<cpu>_<date>-<time>.{json,md}``.
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

from ringtrain.bench.records import lockstep_time

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import write_results  # noqa: E402
from step_bench import MODELS, build_model  # noqa: E402


def time_steps(core: int, model_name: str, steps: int, warmup: int, start: Any, out: Any) -> None:
    """Child: pin to ``core``, wait for ``start``, report every timed step's duration (seconds)."""
    import torch

    from ringtrain.env.allocator import tune_allocator

    os.sched_setaffinity(0, {core})
    tune_allocator("tuned")  # as every process of `ringtrain bench` runs
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
    out.put((core, times))


def measure(cores: list[int], model_name: str, steps: int, warmup: int) -> dict[int, list[float]]:
    """Every timed step's duration per core, with one process on each of ``cores`` at once."""
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


def lockstep_ceiling(steps: dict[int, list[float]]) -> float:
    """Synchronous over independent throughput when each step waits for that step's slowest process."""
    count, lockstep = lockstep_time(list(steps.values()))
    independent = sum(count / sum(series[:count]) for series in steps.values())
    return len(steps) * count / lockstep / independent


def lockstep_efficiency(steps: dict[int, list[float]], alone: dict[int, list[float]]) -> float:
    """Lockstep throughput over ``n`` times one process's alone (the mean over the cores)."""
    count, lockstep = lockstep_time(list(steps.values()))
    single = statistics.mean(len(series) / sum(series) for series in alone.values())
    return count / lockstep / single


def step_jitter(series: list[float]) -> float:
    """Standard deviation over mean of a process's step times."""
    return statistics.stdev(series) / statistics.mean(series)


def medians(steps: dict[int, list[float]]) -> dict[int, float]:
    return {core: statistics.median(series) for core, series in steps.items()}


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
        row = {"alone": medians(alone), "together": medians(together), "ceiling": ceiling(medians(together)),
               "lockstep": lockstep_ceiling(together), "efficiency": lockstep_efficiency(together, alone),
               "jitter": {c: step_jitter(s) for c, s in together.items() if len(s) > 1},
               "steps_alone": alone, "steps_together": together}
        repeats.append(row)
        print(f"repeat {repeat}: alone {fmt(row['alone'])}; at once {fmt(row['together'])}; ceilings: "
              f"balance {row['ceiling']:.3f}, lockstep {row['lockstep']:.3f}; "
              f"lockstep efficiency against one process {row['efficiency']:.3f}", flush=True)
    lines = [f"# Core balance: {machine['date']}", "",
             f"Machine: {machine['cpu']}, {machine['usable_cores']} cores; torch {machine['torch']}, "
             f"ringtrain {machine['ringtrain']} ({machine['commit']}); {machine['os']}.", "",
             f"`benchmarks/core_balance.py --model {args.model} --steps {args.steps} "
             f"--repeats {args.repeats}`: "
             "median training-step time of one single-threaded process pinned to each core, alone and with "
             "one process per core at once (step jitter: standard deviation over mean of the at-once "
             "steps). Ceilings of synchronous over independent throughput with free communication: "
             "balance, `n / max(t) / sum(1 / t_i)` of the at-once medians; lockstep, every step waiting "
             "for that step's slowest process. Efficiency: the lockstep throughput over n times one "
             "process's alone, the best 2-process efficiency against one process that a synchronous "
             "job reaches here.", "",
             "| repeat | " + " | ".join(f"core {c} alone" for c in cores) + " | "
             + " | ".join(f"core {c} at once" for c in cores)
             + " | step jitter | balance | lockstep | efficiency |",
             "|---" * (2 * len(cores) + 5) + "|"]
    for i, r in enumerate(repeats):
        jitter = ", ".join(f"{100 * r['jitter'][c]:.1f} %" for c in cores if c in r["jitter"])
        lines.append(f"| {i} | " + " | ".join(f"{r['alone'][c] * 1e3:.1f} ms" for c in cores) + " | "
                     + " | ".join(f"{r['together'][c] * 1e3:.1f} ms" for c in cores)
                     + f" | {jitter} | {r['ceiling']:.3f} | {r['lockstep']:.3f} | {r['efficiency']:.3f} |")
    lines.append("")
    for key, name in (("ceiling", "Balance ceiling"), ("lockstep", "Lockstep ceiling"),
                      ("efficiency", "Lockstep efficiency against one process")):
        values = [r[key] for r in repeats]
        lines.append(f"{name}: median {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}].")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    write_results(args.out, "core_balance", machine, text,
                  {"model": args.model, "steps": args.steps, "repeats": repeats})
    return 0


def fmt(times: dict[int, float]) -> str:
    return ", ".join(f"core {c} {t * 1e3:.1f} ms" for c, t in sorted(times.items()))


if __name__ == "__main__":
    sys.exit(main())
