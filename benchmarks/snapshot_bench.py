"""What a snapshot costs training: synchronous saves against saves written beside training.

One Trainer in this process (one rank) trains a stack of linear layers whose state is ``--mb`` MB (plain
SGD: the state is the model), with a snapshot every ``--every`` steps, in three runs per pair: no
snapshots, ``snapshot_mode="sync"`` and ``"background"`` (the order rotates from pair to pair). It reports
each save's blocking time (the training thread's) and write time from ``Trainer.snapshot_saves``, and
each run's training seconds (the epochs' ``seconds``: the step snapshots are inside them, start-up and
the last write are not).

    python benchmarks/snapshot_bench.py                          # 100 MB, a snapshot every 20 steps
    python benchmarks/snapshot_bench.py --mb 100 --every 40 --steps 200 --pairs 3 --threads 1

``--method blocks`` measures the same thing in one process, for a machine whose identical runs differ
by more than the effect (a VM's 20-second runs spread by 15 %): one training loop alternates blocks of
``--every`` steps, each block starting with no save, a synchronous save or a background save
(``ringtrain.save_snapshot``; synchronous: its ``wait()`` at once), the three kinds in a rotating order
in each round. A block's time is the save's call, its ``--every`` steps and, for a background save, what
is left of the write after them (what the next save would wait for), so each round's ratios compare
blocks seconds apart.

    python benchmarks/snapshot_bench.py --method blocks --threads 1 --rounds 30

Results go to ``benchmarks/results/snapshot_bench_<cpu>_<date>.{md,json}``; the snapshot folder is a
temporary folder on the file system of ``--dir`` (default: the system's temporary folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from paired import bootstrap_ci
from results_io import write_results
from torch import nn

from ringtrain.bench.machine import describe_machine
from ringtrain.train import Trainer, TrainerConfig
from ringtrain.workloads import TensorPairDataset

WIDTH = 1024
BATCH = 32


def _run(mode: str | None, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One run: its training seconds and the saves' timings (``mode`` None: no snapshots)."""
    layers = max(1, round(args.mb * 1e6 / (4 * (WIDTH * WIDTH + WIDTH))))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    x = torch.randn(args.steps * BATCH, WIDTH)
    data = TensorPairDataset(x, torch.randint(0, WIDTH, (len(x),)))
    snapshots = {} if mode is None else {"snapshot_dir": str(folder / mode), "save_every_steps": args.every,
                                         "snapshot_mode": mode, "resume": False, "keep_last": 2}
    config = TrainerConfig(epochs=1, batch_size=BATCH, progress=False, threads=args.threads,
                           signals_to_handle="", **snapshots)
    with Trainer(model, torch.optim.SGD(model.parameters(), lr=1e-4), nn.CrossEntropyLoss(), data,
                 config=config) as trainer:
        history = trainer.train()
        saves = list(trainer.snapshot_saves)
    return {"seconds": history[0].seconds, "saves": saves}


def _blocks(args: argparse.Namespace, folder: Path) -> dict[str, list[dict[str, float]]]:
    """``--method blocks``: every block's seconds (and its save's blocking time), by kind."""
    import time

    import ringtrain
    from ringtrain.engine.settings import read_knob
    from ringtrain.env.allocator import tune_allocator

    # as hvd.init() and the Trainer do: freed memory is kept for the next step
    tune_allocator(read_knob("malloc"))
    layers = max(1, round(args.mb * 1e6 / (4 * (WIDTH * WIDTH + WIDTH))))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, WIDTH, (BATCH,))

    def steps() -> None:
        for _ in range(args.every):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()

    kinds = ["none", "sync", "background"]
    blocks: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for n in range(args.rounds + 1):  # round 0 warms up: not counted
        for kind in kinds[n % 3:] + kinds[:n % 3]:
            path = folder / f"snapshot-{n}-{kind}.pt"
            started = time.perf_counter()
            handle = None
            if kind != "none":
                handle = ringtrain.save_snapshot({"model": model.state_dict()}, path)
                if kind == "sync":
                    handle.wait()
            blocked = time.perf_counter() - started
            steps()
            if handle is not None:
                handle.wait()
            seconds = time.perf_counter() - started
            if n:
                blocks[kind].append({"seconds": seconds, "blocked_s": blocked,
                                     "written_s": float(handle.written_s or 0.0) if handle else 0.0})
            if handle is not None:
                path.unlink(missing_ok=True)
                path.with_name(path.name + ".json").unlink(missing_ok=True)
        if n:
            line = ", ".join(f"{k} {blocks[k][-1]['seconds']:.2f} s" for k in kinds)
            print(f"round {n}: {line}", flush=True)
    return blocks


def _report_blocks(args: argparse.Namespace, blocks: dict[str, list[dict[str, float]]]) -> int:
    size = args.mb
    machine = describe_machine()
    lines = ["# Snapshots: synchronous against background, blocks of one training loop", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores', '?')} cores; state {size:.0f} MB "
             f"(plain SGD: the model), blocks of {args.every} steps, {args.rounds} rounds, threads "
             f"{args.threads or 'all'}.",
             ""]
    none = [b["seconds"] for b in blocks["none"]]
    lines.append(f"A block of {args.every} steps without a save: {statistics.median(none):.2f} s (median).")
    lines.append("")
    lines += ["| save | blocking time (median) | write (median) | throughput / no save, same round | "
              "95 % interval |", "|---|---|---|---|---|"]
    ratios = {}
    for kind in ("sync", "background"):
        throughput = [a / b["seconds"] for a, b in zip(none, blocks[kind], strict=True)]
        ratios[kind] = throughput
        low, high = bootstrap_ci(throughput)
        blocked = statistics.median(b["blocked_s"] for b in blocks[kind])
        written = statistics.median(b["written_s"] for b in blocks[kind])
        lines.append(f"| {kind} | {1000 * blocked:.0f} ms | {written:.2f} s | "
                     f"{statistics.median(throughput):.3f}x | [{low:.3f}-{high:.3f}] |")
    sync_blocked = statistics.median(b["blocked_s"] for b in blocks["sync"])
    bg_blocked = statistics.median(b["blocked_s"] for b in blocks["background"])
    share = 100 * bg_blocked / sync_blocked
    lines += ["", f"Background blocking time: {share:.1f} % of the synchronous save's."]
    text = "\n".join(lines) + "\n"
    print(text)
    body = {"args": {k: str(v) for k, v in vars(args).items() if k != "out"}, "blocks": blocks,
            "throughput_ratios": ratios}
    write_results(args.out, "snapshot_bench", machine, text, body)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the state (MB)")
    parser.add_argument("--every", type=int, default=20, help="steps between snapshots")
    parser.add_argument("--steps", type=int, default=200, help="steps of each run")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the untimed first run (the first run of a process pays for page "
                             "faults and the file cache)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--dir", type=Path, default=None, help="where the snapshot folders go")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--method", choices=("runs", "blocks"), default="runs",
                        help="runs: whole Trainer runs of each kind; blocks: one loop's blocks of each kind")
    parser.add_argument("--rounds", type=int, default=30, help="--method blocks: rounds of three blocks")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.method == "blocks":
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            return _report_blocks(args, _blocks(args, Path(tmp)))

    modes: list[str | None] = [None, "sync", "background"]
    runs: dict[str, list[dict[str, Any]]] = {str(m): [] for m in modes}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if not args.no_warmup:
            print(f"warm-up (not counted): {_run('background', args, Path(tmp) / 'warmup')['seconds']:.2f} s",
                  flush=True)
        for n in range(args.pairs):
            order = modes[n % 3:] + modes[:n % 3]
            for mode in order:
                result = _run(mode, args, Path(tmp) / str(n))
                runs[str(mode)].append(result)
                blocked = [s.blocked_s for s in result["saves"]]
                print(f"pair {n + 1} {mode or 'none'}: {result['seconds']:.2f} s"
                      + (f", blocked median {1000 * statistics.median(blocked):.0f} ms" if blocked else ""),
                      flush=True)

    def saves(mode: str) -> list[Any]:
        return [s for run in runs[mode] for s in run["saves"]]

    sync_blocked = statistics.median(s.blocked_s for s in saves("sync"))
    bg_blocked = statistics.median(s.blocked_s for s in saves("background"))
    bg_written = statistics.median(s.written_s or 0.0 for s in saves("background"))
    size = statistics.median(s.bytes for s in saves("background"))
    ratios = {mode: [b["seconds"] / a["seconds"] for a, b in zip(runs["None"], runs[mode], strict=True)]
              for mode in ("sync", "background")}
    machine = describe_machine()
    lines = ["# Snapshots: synchronous against background (one rank, plain SGD)", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores', '?')} cores; state {size / 1e6:.0f} MB, "
             f"a snapshot every {args.every} of {args.steps} steps, {args.pairs} runs of each, threads "
             f"{args.threads or 'all'}.", "",
             f"Blocking time per save (median): synchronous {1000 * sync_blocked:.0f} ms, background "
             f"{1000 * bg_blocked:.0f} ms ({100 * bg_blocked / sync_blocked:.1f} % of it); background write "
             f"{bg_written:.2f} s (median).", "",
             "Throughput against the run without snapshots in the same round (its training seconds / the "
             "run's): median [95 % bootstrap interval], and each round's.", "",
             "| run | throughput / without snapshots | 95 % interval | rounds |",
             "|---|---|---|---|"]
    for mode, values in ratios.items():
        throughput = [1.0 / v for v in values]
        low, high = bootstrap_ci(throughput)
        lines.append(f"| {mode} | {statistics.median(throughput):.3f}x | [{low:.3f}-{high:.3f}] | "
                     + ", ".join(f"{v:.3f}" for v in throughput) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    body = {"args": {k: str(v) for k, v in vars(args).items() if k != "out"},
            "seconds": {mode: [r["seconds"] for r in values] for mode, values in runs.items()},
            "saves": {mode: [dataclasses.asdict(s) for s in saves(mode)] for mode in ("sync", "background")},
            "ratios": ratios}
    write_results(args.out, "snapshot_bench", machine, text, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
