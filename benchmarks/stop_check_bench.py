"""What the graceful-stop check costs a training step: ``ringtrain train`` with and without it, paired.

The Trainer agrees on a handled signal (SIGTERM, SIGUSR1) through a one-float sum started after every
optimizer step and read after the next one (``ringtrain.train.preemption``). This benchmark runs the same
job with the check (the default) and without it (``--signals-to-handle ''``) back to back, alternating
which goes first, for each strategy (DDP and Horovod's optimizer), and compares the training seconds
the job itself reports (the epochs' ``seconds`` in ``--results-json``: no start-up, no evaluation).

    python benchmarks/stop_check_bench.py                # 5 pairs per strategy, MNIST CNN, 2 ranks x 1 thread
    python benchmarks/stop_check_bench.py --pairs 3 --strategies ddp

The ratio is with/without the check per pair (above 1: the check costs time); the median of the pairs
with a 95 % bootstrap interval. Results go to ``benchmarks/results/stop_check_bench_<cpu>_<date>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import bootstrap_ci
from results_io import write_results

from ringtrain.bench.machine import describe_machine


def train_seconds(strategy: str, check: bool, args: argparse.Namespace, folder: Path) -> float:
    """One job's training seconds (its epochs' ``seconds`` added up)."""
    results = folder / f"{strategy}-{'check' if check else 'off'}.json"
    argv = [sys.executable, "-m", "ringtrain.cli.main", "train", "mnist", "-np", "2", "--threads", "1",
            "--epochs", str(args.epochs), "--subset", str(args.subset), "--strategy", strategy,
            "--no-progress", "--no-resume", "--results-json", str(results)]
    if not check:
        argv += ["--signals-to-handle", ""]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = json.loads(results.read_text())
    return float(sum(epoch["seconds"] for epoch in body["epochs"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--subset", type=int, default=6000, help="training items per epoch")
    parser.add_argument("--strategies", default="ddp,horovod")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)

    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies.split(","):
            on, off = [], []
            for n in range(args.pairs):
                order = (True, False) if n % 2 == 0 else (False, True)  # alternate which goes first
                timed = {check: train_seconds(strategy, check, args, Path(tmp)) for check in order}
                on.append(timed[True])
                off.append(timed[False])
                print(f"{strategy} pair {n + 1}: with check {timed[True]:.2f} s, "
                      f"without {timed[False]:.2f} s", flush=True)
            ratios = [a / b for a, b in zip(on, off, strict=True)]
            low, high = bootstrap_ci(ratios)
            rows[strategy] = {"with_check_s": on, "without_s": off, "ratios": ratios,
                              "median_ratio": statistics.median(ratios), "ci95": [low, high]}

    machine = describe_machine()
    lines = ["# Graceful-stop check: training seconds with / without it (`ringtrain train mnist -np 2`)", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores', '?')} cores; {args.pairs} pairs per "
             f"strategy, {args.epochs} epoch(s) of {args.subset} items, 2 ranks x 1 thread, gloo.", "",
             "| strategy | with / without (median of pairs) | 95 % interval | pairs |", "|---|---|---|---|"]
    for strategy, row in rows.items():
        low, high = row["ci95"]
        lines.append(f"| {strategy} | {row['median_ratio']:.3f} | [{low:.3f}-{high:.3f}] | "
                     + ", ".join(f"{r:.3f}" for r in row["ratios"]) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, "stop_check_bench", machine,
                  text, {"args": {k: str(v) for k, v in vars(args).items() if k != "out"}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
