"""The many-core CPU sweep: ``ringtrain bench`` at 1, 2, 4 and 8 CPU ranks, and the model checked.

    python3 benchmarks/gpu/cpu_sweep.py --out DIR --budget-s 540     # the GPU machine's 16 cores
    python3 benchmarks/gpu/cpu_sweep.py --out DIR --quick            # a smoke run (1 and 2 ranks)

Two sweeps, GPUs hidden (``CUDA_VISIBLE_DEVICES=""``: every rank trains on the CPU, as on a CPU
cluster): the MNIST CNN (batch 64 per rank) and a CIFAR-shaped ResNet-18 (synthetic 3x32x32, batch 32
per rank), each against one plain process with ``ddp`` and ``horovod`` (weak scaling; torch threads
per rank = cores / 8, so the 8-rank runs fill the machine and smaller runs leave cores idle, as
``ringtrain bench`` does by default). ``ringtrain bench`` measures the loopback link first, so each
measured row gets the cost model's efficiency beside it (docs/bench.md); ``ringtrain bench --validate``
then reports the model's error over both sweeps. The 2-core development machine cannot give these
points: its 4 ranks already oversubscribe it.

Each sweep gets a share of ``--budget-s``; a sweep still running at its deadline is interrupted (what
finished is written, ``ringtrain bench``'s Ctrl-C behaviour). Output under ``--out``: ``mnist/`` and
``resnet18/`` (scaling.json, .csv, .png, logs), ``validation/``, and ``cpu_sweep.json`` with every
command, its exit code and seconds, and the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def sweeps(quick: bool, cores: int) -> list[tuple[str, list[str], float]]:
    """(name, ringtrain bench arguments, share of the budget)."""
    if quick:
        return [("mnist", ["mnist", "--np", "1,2", "--strategies", "ddp,horovod", "--steps", "5",
                           "--warmup-steps", "2", "--repeats", "1", "--subset", "2000"], 0.5),
                ("resnet18", ["synthetic", "--arch", "resnet18", "--batch-size", "4", "--np", "1,2",
                              "--strategies", "horovod", "--steps", "2", "--warmup-steps", "1",
                              "--repeats", "1", "--subset", "64"], 0.5)]
    nps = ",".join(str(n) for n in (1, 2, 4, 8) if n <= cores)
    return [("mnist", ["mnist", "--np", nps, "--strategies", "ddp,horovod", "--steps", "100",
                       "--warmup-steps", "5", "--repeats", "2"], 0.3),
            ("resnet18", ["synthetic", "--arch", "resnet18", "--batch-size", "32", "--np", nps,
                          "--strategies", "ddp,horovod", "--steps", "8", "--warmup-steps", "2",
                          "--repeats", "2", "--subset", "4096"], 0.7)]


def run(argv: list[str], env: dict[str, str], log: Path, deadline_s: float) -> dict[str, Any]:
    """Run ``argv`` with its output in ``log``; SIGINT at the deadline, SIGKILL 60 s later."""
    started = time.monotonic()
    with open(log, "w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        interrupted = False
        try:
            code = proc.wait(timeout=max(1.0, deadline_s))
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
            interrupted = True
            os.killpg(proc.pid, signal.SIGINT)  # ringtrain bench writes what finished
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
            if isinstance(exc, KeyboardInterrupt):
                raise
    return {"argv": argv, "exit_code": code, "seconds": round(time.monotonic() - started, 1),
            "interrupted": interrupted, "log": log.name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=540.0, help="seconds for both sweeps together")
    parser.add_argument("--quick", action="store_true", help="1 and 2 ranks, a few steps")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    summary: dict[str, Any] = {"cores": cores, "budget_s": args.budget_s, "quick": args.quick, "runs": []}
    start = time.monotonic()
    plan = sweeps(args.quick, cores)
    try:
        sweep_all(plan, args, out, env, summary, start)
    except KeyboardInterrupt:  # the stage's time ran out: keep what finished
        summary["interrupted"] = True
    summary["seconds"] = round(time.monotonic() - start, 1)
    (out / "cpu_sweep.json.tmp").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    os.replace(out / "cpu_sweep.json.tmp", out / "cpu_sweep.json")
    for name, _, _ in plan:
        table = out / f"{name}.log"
        if table.exists():
            print(f"--- {name} ---\n" + table.read_text()[-3000:])
    return 0 if all(r["exit_code"] == 0 for r in summary["runs"]) and not summary.get("interrupted") else 1


def sweep_all(plan: list[tuple[str, list[str], float]], args: argparse.Namespace, out: Path,
              env: dict[str, str], summary: dict[str, Any], start: float) -> None:
    """Both sweeps, then the model's validation over what they measured (fills ``summary``)."""
    python = sys.executable
    folders = []
    for index, (name, bench_args, share) in enumerate(plan):
        left = args.budget_s - (time.monotonic() - start)
        # a later sweep gets what an earlier one left over
        later = sum(s for _, _, s in plan[index + 1:])
        deadline = left * share / (share + later) - 30  # room for validation and packing
        folder = out / name
        command = [python, "-m", "ringtrain", "bench", *bench_args, "--out", str(folder), "--no-progress",
                   "--project", "--validate", "--timeout", str(int(max(60, deadline)))]
        summary["runs"].append(run(command, env, out / f"{name}.log", deadline))
        print(f"{name}: exit {summary['runs'][-1]['exit_code']} after {summary['runs'][-1]['seconds']} s",
              flush=True)
        if (folder / "scaling.json").exists():
            folders.append(folder)
            body = json.loads((folder / "scaling.json").read_text())
            summary[name] = {"rows": body.get("rows"), "link": body.get("link"),
                             "validation": body.get("validation"), "machine": body.get("machine")}
    if folders:
        command = [python, "-m", "ringtrain", "bench", "--validate", *map(str, folders), "--out",
                   str(out / "validation")]
        summary["runs"].append(run(command, env, out / "validation.log", 120))
        with open(out / "validation.log") as log:
            summary["validation_report"] = log.read()[-6000:]


if __name__ == "__main__":
    sys.exit(main())
