"""Training-step throughput: ringtrain's DistributedOptimizer vs torch DDP vs one process.

One command, one run, the competitors in the same process tree::

    python benchmarks/step_bench.py            # about 3-4 minutes on 2 cores
    python benchmarks/step_bench.py --quick    # a smoke run (seconds)

Two ranks with one thread each (gloo over loopback) train the Horovod MNIST CNN (batch 64 per rank,
1x28x28) and a CIFAR-shaped ResNet-18 (batch 32 per rank, 3x32x32) on synthetic data, with and
without fp16 gradient compression (``Compression.fp16`` for ringtrain, DDP's ``fp16_compress_hook``
for DDP). Rank 0 first measures a single process (rank 1 waits). Throughput is images/s over all
ranks, measured in timed windows after warm-up.

DDP and ringtrain are timed in pairs of adjacent windows (which one goes first alternates), so a
slow drift of a shared machine hits both halves of a pair alike. The ratio to DDP is the median of
the per-pair ratios, with a 95 % bootstrap confidence interval over the pairs: a claim such as
"at least 0.95x" holds when the interval's lower end is above it, not when one lucky window is.

Results go to ``benchmarks/results/step_bench_<cpu>_<date>.{json,md}``, naming the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from paired import bootstrap_ci, pair_ratios

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

MODELS = {
    # name: (batch per rank, input shape, classes)
    "mnist_cnn": (64, (1, 28, 28), 10),
    "resnet18": (32, (3, 32, 32), 10),
}


def build_model(name: str) -> torch.nn.Module:
    """The benchmarked networks, from ringtrain's built-in workloads."""
    from ringtrain.workloads.models.mnist_cnn import HorovodMnistNet
    from ringtrain.workloads.models.resnet import resnet18_cifar

    torch.manual_seed(0)
    return HorovodMnistNet() if name == "mnist_cnn" else resnet18_cifar()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Variant:
    """One competitor: a model, its optimizer and a step function on a fixed synthetic batch."""

    def __init__(self, label: str, model_name: str,
                 make: Callable[[torch.nn.Module], tuple[Any, Any]]) -> None:
        batch, shape, classes = MODELS[model_name]
        gen = torch.Generator().manual_seed(1 + (dist.get_rank() if dist.is_initialized() else 0))
        self.x = torch.randn(batch, *shape, generator=gen)
        self.y = torch.randint(0, classes, (batch,), generator=gen)
        self.label = label
        self.model_name = model_name
        self.batch = batch
        self.model, self.optimizer = make(build_model(model_name))
        self.windows: list[float] = []  # images/s over all ranks, one value per window

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(self.x)
        loss = F.nll_loss(out, self.y) if self.model_name == "mnist_cnn" else F.cross_entropy(out, self.y)
        loss.backward()
        self.optimizer.step()

    def window(self, steps: int, world: int) -> None:
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        elapsed = time.perf_counter() - start
        if world > 1:
            # the slowest rank sets the pace: take the longest window of all ranks
            t = torch.tensor([elapsed], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed = float(t)
        self.windows.append(steps * self.batch * world / elapsed)


def _sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def make_single(model: torch.nn.Module) -> tuple[Any, Any]:
    return model, _sgd(model)


def make_ddp(fp16: bool) -> Callable[[torch.nn.Module], tuple[Any, Any]]:
    def make(model: torch.nn.Module) -> tuple[Any, Any]:
        # broadcast_buffers=False: Horovod does not sync BatchNorm buffers every step either
        ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        if fp16:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

            ddp.register_comm_hook(None, fp16_compress_hook)
        return ddp, _sgd(model)
    return make


def make_ringtrain(fp16: bool) -> Callable[[torch.nn.Module], tuple[Any, Any]]:
    def make(model: torch.nn.Module) -> tuple[Any, Any]:
        import ringtrain as hvd

        opt = hvd.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters(),
                                       compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, opt
    return make


def measure(variants: list[Variant], warmup: int, windows: int, steps: dict[str, int], world: int) -> None:
    """Warm every variant up, then time ``windows`` windows, round-robin across the variants."""
    for v in variants:
        for _ in range(warmup):
            v.step()
    for _ in range(windows):
        for v in variants:
            v.window(steps[v.model_name], world)


def measure_pairs(pairs: list[tuple[Variant, Variant]], warmup: int, windows: int, steps: dict[str, int],
                  world: int) -> None:
    """Time each (DDP, ringtrain) pair in adjacent windows, alternating which one goes first."""
    for pair in pairs:
        for v in pair:
            for _ in range(warmup):
                v.step()
    for i in range(windows):
        for pair in pairs:
            for v in (pair if i % 2 == 0 else pair[::-1]):
                v.window(steps[v.model_name], world)


def worker(rank: int, world: int, port: int, ddp_port: int, cfg: dict[str, Any], out: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                       # as under `ringtrain run`: every connection proves the job's secret (at connect
                       # time only; the timed steps run on connections already proven)
                       "RINGTRAIN_JOB_SECRET": cfg["secret"]})
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ddp_port}", rank=rank, world_size=world)
    models, warmup, windows, steps = cfg["models"], cfg["warmup"], cfg["windows"], cfg["steps"]
    results: list[dict[str, Any]] = []

    # 1. one process (rank 0 alone; rank 1 waits in a barrier)
    if rank == 0:
        singles = [Variant("single process", m, make_single) for m in models]
        measure(singles, warmup, windows, steps, world=1)
        results += [{"model": v.model_name, "variant": v.label, "windows": v.windows} for v in singles]
    dist.barrier()

    # 2. DDP and ringtrain side by side, in paired windows
    import ringtrain as hvd

    hvd.init()
    ddp = [Variant(f"torch DDP{' fp16' if fp16 else ''}", m, make_ddp(fp16))
           for m in models for fp16 in (False, True)]
    ours = [Variant(f"ringtrain{' fp16' if fp16 else ''}", m, make_ringtrain(fp16))
            for m in models for fp16 in (False, True)]
    measure_pairs(list(zip(ddp, ours)), warmup, windows, steps, world)
    hvd.shutdown()

    results += [{"model": v.model_name, "variant": v.label, "windows": v.windows} for v in ddp + ours]
    dist.barrier()
    # DDP wrappers must not outlive their gloo group (its destructor can deadlock on the GIL)
    del ddp, ours
    gc.collect()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        cpu = found.group(1).strip() if found else cpu
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(),
            "os": platform.platform(), "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit}


def summarize(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for entry in raw:
        w = entry["windows"]
        rows.append({**entry, "median": statistics.median(w), "min": min(w), "max": max(w)})
    by_key = {(r["model"], r["variant"]): r for r in rows}
    for r in rows:
        fp16 = r["variant"].endswith("fp16")
        ddp = by_key.get((r["model"], "torch DDP fp16" if fp16 else "torch DDP"))
        r["vs_ddp"] = r["vs_ddp_ci"] = None
        if ddp and r["variant"].startswith("ringtrain"):
            # window i of both was timed back to back: compare within the pair
            pairs = pair_ratios(r["windows"], ddp["windows"])
            r["pair_ratios"] = pairs
            r["vs_ddp"] = statistics.median(pairs)
            r["vs_ddp_ci"] = bootstrap_ci(pairs)
        elif ddp and r["variant"].startswith("torch DDP"):
            r["vs_ddp"] = 1.0
        single = by_key.get((r["model"], "single process"))
        r["vs_single"] = r["median"] / single["median"] if single else None
    return rows


def markdown(rows: list[dict[str, Any]], info: dict[str, Any], cfg: dict[str, Any]) -> str:
    lines = [f"# Step benchmark: {info['date']}", "",
             f"Machine: {info['cpu']}, {info['cores']} cores; torch {info['torch']}, "
             f"Python {info['python']}; "
             f"{info['os']}; commit {info['commit']}.", "",
             "2 ranks x 1 thread (gloo, loopback) unless noted; synthetic data; "
             f"warm-up {cfg['warmup']} steps, "
             f"{cfg['windows']} timed windows of "
             + ", ".join(f"{n} steps ({m})" for m, n in cfg["steps"].items() if m in cfg["models"])
             + ". Images/s over all ranks: median "
             "(min-max of the windows). vs DDP: median of the ratios of paired adjacent windows "
             "[95 % bootstrap confidence interval].", "",
             "| model | variant | images/s | spread | vs DDP | vs 1 process |", "|---|---|---|---|---|---|"]
    for r in rows:
        vs_ddp = f"{r['vs_ddp']:.3f}x" if r["vs_ddp"] is not None else ""
        if r.get("vs_ddp_ci"):
            low, high = r["vs_ddp_ci"]
            vs_ddp += f" [{low:.3f}-{high:.3f}]"
        vs_single = f"{r['vs_single']:.2f}x" if r["vs_single"] is not None else ""
        lines.append(f"| {r['model']} | {r['variant']} | {r['median']:.1f} | {r['min']:.1f}-{r['max']:.1f} "
                     f"| {vs_ddp} | {vs_single} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {list(MODELS)}")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per variant")
    parser.add_argument("--windows", type=int, default=16, help="timed windows per variant")
    parser.add_argument("--mnist-steps", type=int, default=30, help="steps per window, MNIST CNN")
    parser.add_argument("--resnet-steps", type=int, default=3, help="steps per window, ResNet-18")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 windows of few steps")
    parser.add_argument("--out-dir", default=str(RESULTS), help="where the JSON and Markdown go")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    cfg = {"models": models, "warmup": args.warmup, "windows": args.windows,
           "steps": {"mnist_cnn": args.mnist_steps, "resnet18": args.resnet_steps},
           "secret": secrets.token_hex(32)}
    if args.quick:
        cfg.update(warmup=1, windows=2, steps={"mnist_cnn": 3, "resnet18": 1})
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "raw.json")
        mp.spawn(worker, args=(2, _free_port(), _free_port(), cfg, out), nprocs=2, join=True)
        raw = json.loads(Path(out).read_text())
    rows = summarize(raw)
    report = markdown(rows, info, cfg)
    print(report)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", info["cpu"].lower()).strip("-")[:40]
    stem = f"step_bench_{slug}_{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M')}"
    if args.quick:
        stem += "_quick"
    (out_dir / f"{stem}.json").write_text(json.dumps({"machine": info, "config": cfg, "results": rows},
                                                      indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(report)
    print(f"wrote {out_dir / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
