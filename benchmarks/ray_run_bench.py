"""``ringtrain run --ray`` against ``ringtrain run``: the same two ranks' training throughput, paired.

Both jobs run the MNIST CNN through the Trainer as the ranks' command (``ringtrain run [--ray ADDR] -np 2
python -m ringtrain train mnist ...``: each rank is a rank of the launcher's job), on this machine: the
Ray one on a local Ray cluster of two CPUs that this benchmark starts (and keeps up during both jobs,
so that its daemons load the machine the same for both). Pairs run back to back, alternating which goes
first; each job's throughput is its optimizer steps over the training seconds it reports itself
(``--results-json``: no start-up, no evaluation).

    python benchmarks/ray_run_bench.py                 # 3 pairs, 1 epoch of 6000 items, 2 ranks x 1 thread
    python benchmarks/ray_run_bench.py --pairs 5 --subset 12000
    python benchmarks/ray_run_bench.py --pairs 2 --cpu-accounting   # and the CPU seconds of every role

With ``--cpu-accounting`` each job also records the CPU seconds (utime + stime, from /proc) that each role
ran while its ranks lived: the ranks, the driver (``ringtrain run``; the plain job's agent runs in it), the
Ray job's node agent and actors, this local Ray cluster's daemons, this benchmark, and everything else on
the machine (``other``). CPU seconds do not depend on the machine's load, unlike the step rate.

The ratio is Ray / plain throughput per pair (1: the same; the issue asks at least 0.97); the median of
the pairs with a 95 % bootstrap interval. Results go to ``benchmarks/results/ray_run_bench_<cpu>_<date>.*``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import bootstrap_ci  # noqa: E402
from process_cpu import ROLES, CpuAccount  # noqa: E402
from results_io import write_results  # noqa: E402

from ringtrain.bench.machine import describe_machine  # noqa: E402


def throughput(address: str | None, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    """One job's optimizer steps per training second, with its steps, seconds and final accuracy."""
    results = folder / f"{'ray' if address else 'plain'}.json"
    where = ["--ray", address] if address else []
    argv = [sys.executable, "-m", "ringtrain", "run", *where, "-np", "2", sys.executable, "-m", "ringtrain",
            "train", "mnist", "--threads", "1", "--epochs", str(args.epochs), "--subset", str(args.subset),
            "--no-progress", "--no-resume", "--results-json", str(results)]
    with open(folder / "job.log", "w+") as log:
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        account = CpuAccount(job.pid).start() if args.cpu_accounting else None
        code = job.wait()
        if account is not None:
            account.stop()
        log.seek(0)
        output = log.read()
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({code}):\n{output[-3000:]}")
    body = json.loads(results.read_text())
    seconds = sum(float(epoch["seconds"]) for epoch in body["epochs"])
    steps = sum(int(epoch.get("steps") or 0) for epoch in body["epochs"])
    if body["world_size"] != 2 or not steps:
        raise SystemExit(f"{' '.join(argv)} trained on {body['world_size']} rank(s), {steps} steps: not "
                         "the job meant")
    found = {"seconds": seconds, "steps": steps, "steps_per_s": steps / seconds,
             "accuracy": float(body["epochs"][-1].get("accuracy") or float("nan"))}
    if account is not None:
        low, high = account.window()
        found.update({"window_s": high - low, "cpu_s": account.by_role(), "rank_nice": account.rank_nice(),
                      "rank_wait_s": account.rank_wait()})
    return found


def cpu_table(plain: list[dict], on_ray: list[dict]) -> list[str]:
    """The CPU seconds of each role while the ranks ran, median over the jobs of each arm, and as a
    share of one core over that window."""
    def median(jobs: list[dict], role: str) -> float:
        return statistics.median(job["cpu_s"][role] for job in jobs)

    windows = [statistics.median(job["window_s"] for job in jobs) for jobs in (plain, on_ray)]
    waits = [statistics.median(job["rank_wait_s"] for job in jobs) for jobs in (plain, on_ray)]
    lines = ["CPU seconds while the ranks ran (median of each arm's jobs; % of one core over the window: "
             f"plain {windows[0]:.1f} s, ray {windows[1]:.1f} s). Rank niceness: plain "
             f"{sorted({n for job in plain for n in job['rank_nice']})}, ray "
             f"{sorted({n for job in on_ray for n in job['rank_nice']})}. The ranks waited for a CPU "
             f"(run queue, both together, median): plain {waits[0]:.2f} s, ray {waits[1]:.2f} s.", "",
             "| role | plain CPU s | plain % core | ray CPU s | ray % core |", "|---|---|---|---|---|"]
    for role in ROLES:
        values = [median(jobs, role) for jobs in (plain, on_ray)]
        lines.append(f"| {role} | {values[0]:.2f} | {100 * values[0] / windows[0]:.1f} | {values[1]:.2f} | "
                     f"{100 * values[1] / windows[1]:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--subset", type=int, default=6000, help="training items per epoch")
    parser.add_argument("--cpu-accounting", action="store_true",
                        help="also record the CPU seconds of every process role while the ranks run")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile (for the record)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)

    import ray

    load_before = os.getloadavg()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    plain: list[dict[str, float]] = []
    on_ray: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.pairs):
                order = (None, address) if n % 2 == 0 else (address, None)  # alternate which goes first
                timed = {where: throughput(where, args, Path(tmp)) for where in order}
                plain.append(timed[None])
                on_ray.append(timed[address])
                print(f"pair {n + 1}: plain {timed[None]['steps_per_s']:.2f} steps/s, ray "
                      f"{timed[address]['steps_per_s']:.2f} steps/s", flush=True)
    finally:
        ray.shutdown()
    load_after = os.getloadavg()
    ratios = [r["steps_per_s"] / p["steps_per_s"] for r, p in zip(on_ray, plain, strict=True)]
    low, high = bootstrap_ci(ratios)
    machine = describe_machine()
    lines = ["# `ringtrain run --ray -np 2` against `ringtrain run -np 2`: training throughput", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores', '?')} cores; one local Ray cluster of 2 "
             f"CPUs up during both jobs; {args.pairs} pairs, {args.epochs} epoch(s) of {args.subset} MNIST "
             "items, 2 ranks x 1 thread, gloo, DDP (the Trainer's default).",
             f"Load: {args.note or 'not noted'}; load average (1, 5, 15 min) "
             f"{', '.join(f'{x:.1f}' for x in load_before)} before, "
             f"{', '.join(f'{x:.1f}' for x in load_after)} after.", "",
             "| pair | plain steps/s | ray steps/s | ray / plain | plain accuracy | ray accuracy |",
             "|---|---|---|---|---|---|"]
    for n, (p, r, ratio) in enumerate(zip(plain, on_ray, ratios, strict=True), 1):
        lines.append(f"| {n} | {p['steps_per_s']:.2f} | {r['steps_per_s']:.2f} | {ratio:.3f} | "
                     f"{p['accuracy']:.4f} | {r['accuracy']:.4f} |")
    lines += ["", f"Median ray / plain: **{statistics.median(ratios):.3f}** (95 % interval "
                  f"[{low:.3f}-{high:.3f}], {args.pairs} pairs)."]
    if args.cpu_accounting:
        lines += ["", *cpu_table(plain, on_ray)]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, "ray_run_bench", machine, text,
                  {"args": {k: str(v) for k, v in vars(args).items() if k != "out"}, "plain": plain,
                   "ray": on_ray, "ratios": ratios, "median_ratio": statistics.median(ratios),
                   "ci95": [low, high], "load_before": load_before, "load_after": load_after})
    return 0


if __name__ == "__main__":
    sys.exit(main())
