"""Where a training step's time goes: the Trainer of `ringtrain bench` under cProfile, rank by rank.

    python benchmarks/profile_step.py                        # MNIST CNN, horovod, 2 ranks vs 1 process
    python benchmarks/profile_step.py --strategy ddp --steps 150
    python benchmarks/profile_step.py --workload synthetic --arch resnet18 --batch-size 32 --steps 20

Runs the same worker as `ringtrain bench` (1 thread per process) once alone and once on ``--np``
ranks through `ringtrain run`, each under cProfile, and prints per step: forward, backward, the
optimizer step (for horovod: the wait for the gradients' allreduce in ``synchronize`` apart),
data loading, metric bookkeeping and the rest of the loop. cProfile adds a little to every Python
call (about 1 ms per MNIST step), so read the split, not the absolute numbers; DDP's allreduce runs
inside backward (C++ hooks), so for ddp it shows up as a longer backward.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

LOOP = "_train_batches"
#: category -> (callee file, callee function, caller function or None for any caller)
CATEGORIES = {
    "train loop": ("train/trainer.py", LOOP, None),
    "forward + loss": ("torch/nn/modules/module.py", "_wrapped_call_impl", LOOP),
    "backward": ("torch/_tensor.py", "backward", LOOP),
    "optimizer step": ("train/strategies.py", "step", LOOP),
    "allreduce wait": ("ringtrain/optimizer.py", "synchronize", None),
    "data loading": ("train/data.py", "epoch", LOOP),
    "metrics": ("train/metrics.py", "add", LOOP),
}


def _cumulative(stats: pstats.Stats, file: str, name: str, caller: str | None) -> tuple[float, int]:
    """Cumulative seconds and calls of ``file:name`` (only when called from ``caller``)."""
    total, calls = 0.0, 0
    for (path, _, func), (_, ncalls, _, cumtime, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if not (path.endswith(".py") and file in path and func == name):
            continue
        if caller is None:
            total, calls = total + cumtime, calls + ncalls
            continue
        for (_, _, caller_func), entry in callers.items():
            if caller_func == caller:  # entry: (primitive calls, calls, own time, cumulative time)
                total, calls = total + entry[3], calls + entry[1]
    return total, calls


def breakdown(path: Path) -> dict[str, float]:
    """Seconds per step of every category in one rank's profile."""
    stats = pstats.Stats(str(path))
    steps = max(1, _cumulative(stats, *CATEGORIES["optimizer step"])[1])
    out = {name: _cumulative(stats, *entry)[0] / steps for name, entry in CATEGORIES.items()}
    # the optimizer step contains the wait; report the step without it
    out["optimizer step"] -= out["allreduce wait"]
    named = sum(v for k, v in out.items() if k != "train loop")
    out["rest of the loop"] = out["train loop"] - named
    out["steps"] = steps
    return out


def worker(spec: str, out_dir: str) -> int:
    from ringtrain.bench.worker import run

    rank = int(os.environ.get("RANK", "0"))
    profile = cProfile.Profile()
    profile.enable()
    run(json.loads(spec))
    profile.disable()
    profile.dump_stats(os.path.join(out_dir, f"rank{rank}.pstats"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="mnist")
    parser.add_argument("--arch")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--strategy", default="horovod", choices=("horovod", "ddp"))
    parser.add_argument("--fp16", action="store_true", help="fp16 gradients")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    spec = {"workload": args.workload, "arch": args.arch, "batch_size": args.batch_size, "steps": args.steps,
            "warmup_steps": 5, "threads": 1, "seed": 0, "phases": False, "fp16_allreduce": args.fp16}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, strategy, np in (("1 process", "ddp", 1), (f"{args.np} ranks", args.strategy, args.np)):
            folder = Path(tmp) / label.replace(" ", "-")
            folder.mkdir()
            body = json.dumps({**spec, "strategy": strategy, "bench_strategy": strategy})
            me = [sys.executable, __file__, "--worker", body, str(folder)]
            argv_ = me if np == 1 else [sys.executable, "-m", "ringtrain", "run", "-np", str(np), *me]
            subprocess.run(argv_, env=env, check=True, stdout=subprocess.DEVNULL)
            results[label] = {p.stem: breakdown(p) for p in sorted(folder.glob("rank*.pstats"))}
    names = [*CATEGORIES, "rest of the loop"]
    names.remove("train loop")
    columns = [(label, rank) for label, ranks in results.items() for rank in ranks]
    print(f"{args.workload} {args.arch or ''} {args.strategy}{' fp16' if args.fp16 else ''}: "
          "milliseconds per step (cProfile)")
    print(f"{'':18}" + "".join(f"{label + ' ' + rank:>18}" for label, rank in columns))
    for name in [*names, "train loop"]:
        print(f"{name:18}" + "".join(f"{1000 * results[label][rank][name]:18.2f}" for label, rank in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
