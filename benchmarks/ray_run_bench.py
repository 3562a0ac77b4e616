"""``ringtrain run --ray`` against ``ringtrain run``: the same two ranks' training throughput, paired.

Both jobs run the MNIST CNN through the Trainer as the ranks' command (``ringtrain run [--ray ADDR] -np 2
python -m ringtrain train mnist ...``: each rank is a rank of the launcher's job), on this machine: the
Ray one on a local Ray cluster of two CPUs that this benchmark starts (and keeps up during both jobs,
so that its daemons load the machine the same for both). Pairs run back to back, alternating which goes
first; each job's throughput is its optimizer steps over the training seconds it reports itself
(``--results-json``: no start-up, no evaluation).

    python benchmarks/ray_run_bench.py                 # 3 pairs, 1 epoch of 6000 items, 2 ranks x 1 thread
    python benchmarks/ray_run_bench.py --pairs 5 --subset 12000

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
from results_io import write_results  # noqa: E402

from ringtrain.bench.machine import describe_machine  # noqa: E402


def throughput(address: str | None, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    """One job's optimizer steps per training second, with its steps, seconds and final accuracy."""
    results = folder / f"{'ray' if address else 'plain'}.json"
    where = ["--ray", address] if address else []
    argv = [sys.executable, "-m", "ringtrain", "run", *where, "-np", "2", sys.executable, "-m", "ringtrain",
            "train", "mnist", "--threads", "1", "--epochs", str(args.epochs), "--subset", str(args.subset),
            "--no-progress", "--no-resume", "--results-json", str(results)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    body = json.loads(results.read_text())
    seconds = sum(float(epoch["seconds"]) for epoch in body["epochs"])
    steps = sum(int(epoch.get("steps") or 0) for epoch in body["epochs"])
    if body["world_size"] != 2 or not steps:
        raise SystemExit(f"{' '.join(argv)} trained on {body['world_size']} rank(s), {steps} steps: not "
                         "the job meant")
    return {"seconds": seconds, "steps": steps, "steps_per_s": steps / seconds,
            "accuracy": float(body["epochs"][-1].get("accuracy") or float("nan"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--subset", type=int, default=6000, help="training items per epoch")
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
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, "ray_run_bench", machine, text,
                  {"args": {k: str(v) for k, v in vars(args).items() if k != "out"}, "plain": plain,
                   "ray": on_ray, "ratios": ratios, "median_ratio": statistics.median(ratios),
                   "ci95": [low, high], "load_before": load_before, "load_after": load_after})
    return 0


if __name__ == "__main__":
    sys.exit(main())
