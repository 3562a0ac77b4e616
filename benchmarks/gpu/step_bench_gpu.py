"""GPU training-step benchmark at size 1: ringtrain's DistributedOptimizer against the plain PyTorch loop
and torch DDP, on a CIFAR ResNet-18 (batch 128) and an ImageNet-shaped ResNet-50 (batch 64), fp32 and
AMP (fp16 autocast + GradScaler). One process, one GPU::

    python3 benchmarks/gpu/step_bench_gpu.py --out DIR                 # about 4 minutes on an H100
    python3 benchmarks/gpu/step_bench_gpu.py --device cpu --quick      # a smoke run on a CPU (a minute)

Competitors, each with its own copy of the same model (same initial weights) and a fixed random batch
already on the device:

- ``plain``: the loop with no distributed code at all (the baseline);
- ``ringtrain``: ``hvd.init()``, ``DistributedOptimizer`` and ``broadcast_parameters``, as a one-GPU
  user of the Horovod API runs it (at size 1 the optimizer registers no hooks: nothing to average);
- ``ringtrain-engine``: the same with the gradient hooks forced on, so every bucket is negotiated by
  the engine and allreduced over NCCL with one member: the cost of ringtrain's machinery itself;
- ``ddp``: ``DistributedDataParallel`` over an NCCL group of one (gloo on the CPU).

Timing: ``torch.cuda.synchronize()`` before and after every window of steps (the host clock then times
the device's work, not the launches); warm-up steps excluded (cuDNN autotuning, allocator growth).
Each round times one window of every competitor back to back, the order rotating from round to round;
a ratio such as ringtrain / plain is taken inside each round and summarized as the median of the rounds
with a 95 % bootstrap confidence interval (``benchmarks/paired.py``), so drift of clocks and
temperature cancels. The target is ringtrain's step time within 2 % of the plain loop: *shown* when
the interval's upper end is at most 1.02, *missed* when its lower end is above 1.02.

Output: ``gpu_step_bench_<device>_<date>.{json,md}`` in ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # benchmarks/paired.py
sys.path.insert(0, str(ROOT / "src"))  # ringtrain without installing it (the GPU machine is offline)

from paired import bootstrap_ci, pair_ratios  # noqa: E402

TARGET = 1.02
COMPETITORS = ("plain", "ringtrain", "ringtrain-engine", "ddp")


# --- models ------------------------------------------------------------------------------------------

class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here), 1x1 expand by 4, with a projection shortcut where shapes change."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * 4
        self.body = nn.Sequential(
            nn.Conv2d(in_planes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True), nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != out:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """The ImageNet ResNet-50 (7x7 stem, max-pool, bottleneck stages [3, 4, 6, 3]; 25.6 M parameters)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, in_planes = [], 64
        for i, count in enumerate((3, 4, 6, 3)):
            planes = 64 * 2**i
            for j in range(count):
                blocks.append(Bottleneck(in_planes, planes, 2 if i > 0 and j == 0 else 1))
                in_planes = planes * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    batch: int
    shape: tuple[int, int, int]
    classes: int
    build: Callable[[], nn.Module]


def workloads(quick: bool) -> dict[str, Workload]:
    from ringtrain.workloads.models.resnet import resnet18_cifar

    if quick:  # the same code on sizes a CPU finishes in seconds
        return {"resnet18_cifar": Workload("resnet18_cifar", 8, (3, 32, 32), 10, resnet18_cifar),
                "resnet50_imagenet": Workload("resnet50_imagenet", 2, (3, 64, 64), 1000, ResNet50)}
    return {"resnet18_cifar": Workload("resnet18_cifar", 128, (3, 32, 32), 10, resnet18_cifar),
            "resnet50_imagenet": Workload("resnet50_imagenet", 64, (3, 224, 224), 1000, ResNet50)}


# --- competitors -------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Competitor:
    """One way to train: a model of its own, its optimizer, and ``step()`` on a fixed device batch."""

    def __init__(self, name: str, workload: Workload, device: torch.device, amp: bool, group: Any) -> None:
        import ringtrain as hvd
        from ringtrain.engine import state

        self.name, self.device, self.amp = name, device, amp
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(workload.batch, *workload.shape, generator=gen).to(device)
        self.y = torch.randint(0, workload.classes, (workload.batch,), generator=gen).to(device)
        torch.manual_seed(0)
        model = workload.build().to(device)
        optimizer: Any = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.horovod = name.startswith("ringtrain")
        if name == "ddp":
            device_ids = [device.index] if device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids, process_group=group)
        elif self.horovod:
            engine = state.require()
            forced = name == "ringtrain-engine"
            saved = engine.settings
            # elastic=True is what makes DistributedOptimizer communicate in a one-rank job
            engine.settings = dataclasses.replace(saved, elastic=forced)
            try:
                optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            finally:
                engine.settings = saved
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self.hooks = len(optimizer._hook_handles)
        self.model, self.optimizer = model, optimizer
        self.scaler = torch.amp.GradScaler(device.type) if amp else None
        self.autocast_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.windows: list[float] = []  # seconds per step, one value per window

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.amp):
            loss = F.cross_entropy(self.model(self.x), self.y)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
            return
        self.scaler.scale(loss).backward()
        if self.horovod:
            # Horovod's AMP recipe (the Trainer's): average first, then unscale and step
            self.optimizer.synchronize()
            self.scaler.unscale_(self.optimizer)
            with self.optimizer.skip_synchronize():
                self.scaler.step(self.optimizer)
        else:
            self.scaler.step(self.optimizer)
        self.scaler.update()

    def window(self, steps: int) -> float:
        synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        synchronize(self.device)
        seconds = (time.perf_counter() - start) / steps
        self.windows.append(seconds)
        return seconds


def measure(workload: Workload, device: torch.device, amp: bool, group: Any, cfg: dict[str, Any]) -> dict:
    """Warm every competitor up, size the windows, then time rotating rounds of windows."""
    competitors = [Competitor(name, workload, device, amp, group) for name in cfg["competitors"]]
    for c in competitors:
        for _ in range(cfg["warmup"]):
            c.step()
    # steps per window: about cfg["window_s"] seconds of the slowest competitor
    probe = max(c.window(cfg["probe_steps"]) for c in competitors)
    for c in competitors:
        c.windows.clear()
    steps = max(1, round(cfg["window_s"] / probe))
    for i in range(cfg["rounds"]):
        shift = i % len(competitors)
        for c in competitors[shift:] + competitors[:shift]:
            c.window(steps)
    plain = next((c for c in competitors if c.name == "plain"), None)
    result: dict[str, Any] = {"workload": workload.name, "batch": workload.batch, "shape": workload.shape,
                              "precision": "amp" if amp else "fp32", "steps_per_window": steps,
                              "rounds": cfg["rounds"], "competitors": {}}
    for c in competitors:
        entry: dict[str, Any] = {
            "step_ms_median": 1e3 * statistics.median(c.windows),
            "step_ms_min": 1e3 * min(c.windows), "step_ms_max": 1e3 * max(c.windows),
            "images_per_s": workload.batch / statistics.median(c.windows),
            "windows_s_per_step": c.windows}
        if c.horovod:
            entry["gradient_hooks"] = c.hooks
        if plain is not None and c is not plain:
            ratios = pair_ratios(c.windows, plain.windows)  # step time / plain's, within each round
            low, high = bootstrap_ci(ratios)
            entry.update(vs_plain=statistics.median(ratios), vs_plain_ci=[low, high],
                         target=verdict(low, high) if c.horovod else None)
        result["competitors"][c.name] = entry
    del competitors
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def verdict(low: float, high: float) -> str:
    """The 2 % target against the interval of ratios (step time / plain step time)."""
    if high <= TARGET:
        return f"shown (within {100 * (TARGET - 1):.0f} %)"
    if low > TARGET:
        return f"missed (over {100 * (TARGET - 1):.0f} %)"
    return "not decided (the interval straddles the target: more rounds)"


# --- the run -----------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def machine(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = found.group(1).strip() if found else cpu
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "os": platform.platform(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cudnn=torch.backends.cudnn.version(),
                    nccl=".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else None)
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            info["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                        capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["commit"] = ""
    return info


def markdown(results: list[dict], info: dict[str, Any], cfg: dict[str, Any]) -> str:
    where = info.get("gpu") or info["cpu"]
    lines = [f"# GPU step benchmark, size 1: {info['date']}", "",
             f"Device: {where} ({info['device']}); CPU {info['cpu']}, {info['cores']} cores; torch "
             f"{info['torch']} (CUDA {info['cuda']}), Python {info['python']}; commit {info.get('commit')}.",
             "",
             f"Warm-up {cfg['warmup']} steps per competitor; {cfg['rounds']} rounds of one "
             f"~{cfg['window_s']} s window per competitor, order rotating; CUDA-synchronized. Step time: "
             "median of the windows (min-max). vs plain: step time / plain's, median of the per-round "
             f"ratios [95 % bootstrap interval]; target: ringtrain within {100 * (TARGET - 1):.0f} % of "
             "the plain loop.", "",
             "| model | batch | precision | competitor | step ms | spread ms | images/s | vs plain "
             "| target |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name, c in r["competitors"].items():
            vs = ""
            if c.get("vs_plain") is not None:
                low, high = c["vs_plain_ci"]
                vs = f"{c['vs_plain']:.4f} [{low:.4f}-{high:.4f}]"
            lines.append(f"| {r['workload']} | {r['batch']} | {r['precision']} | {name} | "
                         f"{c['step_ms_median']:.2f} | {c['step_ms_min']:.2f}-{c['step_ms_max']:.2f} | "
                         f"{c['images_per_s']:.0f} | {vs} | {c.get('target') or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--models", default="resnet18_cifar,resnet50_imagenet")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--competitors", default=",".join(COMPETITORS))
    parser.add_argument("--warmup", type=int, default=15, help="untimed steps per competitor")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (one window per competitor)")
    parser.add_argument("--window-s", type=float, default=1.0, help="seconds per window (about)")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny inputs, 2 rounds")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU. HINT: --device cpu --quick for a smoke run")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # the same for every competitor
    else:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    cfg = {"warmup": args.warmup, "rounds": args.rounds, "window_s": args.window_s, "probe_steps": 3,
           "competitors": [c for c in args.competitors.split(",") if c]}
    if args.quick:
        cfg.update(warmup=1, rounds=2, window_s=0.01, probe_steps=1)
    known = workloads(args.quick)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models + cfg["competitors"] if m not in known and m not in COMPETITORS]
    if unknown:
        parser.error(f"unknown {unknown}: models are {list(known)}, competitors {list(COMPETITORS)}")

    import ringtrain as hvd

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)  # one process on its own, whatever launched it
    hvd.init()
    group = None
    if "ddp" in cfg["competitors"]:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        group = dist.group.WORLD
    info = machine(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", (info.get("gpu") or info["cpu"]).lower()).strip("-")[:40]
    stem = f"gpu_step_bench_{slug}_{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M')}"
    if args.quick:
        stem += "_quick"
    results: list[dict[str, Any]] = []
    interrupted = False
    try:
        for model in models:
            for precision in [p for p in args.precisions.split(",") if p]:
                started = time.perf_counter()
                result = measure(known[model], device, precision == "amp", group, cfg)
                result["seconds"] = time.perf_counter() - started
                results.append(result)
                print(f"{model} {precision}: " + ", ".join(
                    f"{n} {c['step_ms_median']:.2f} ms"
                    + (f" ({c['vs_plain']:.4f}x)" if "vs_plain" in c else "")
                    for n, c in result["competitors"].items()), flush=True)
                write(out, stem, info, cfg, results, interrupted=False)  # each finished configuration
    except KeyboardInterrupt:  # out of time: what finished is written
        interrupted = True
    report = write(out, stem, info, cfg, results, interrupted)
    print(report)
    print(f"wrote {out / stem}.json and .md")
    hvd.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 1 if interrupted else 0


def write(out: Path, stem: str, info: dict[str, Any], cfg: dict[str, Any], results: list[dict[str, Any]],
          interrupted: bool) -> str:
    """Write the JSON and Markdown (atomically); returns the Markdown."""
    report = markdown(results, info, cfg)
    if interrupted:
        report += "\nInterrupted: the configurations above are the ones that finished.\n"
    body = {"machine": info, "config": cfg, "target": TARGET, "interrupted": interrupted, "results": results}
    files = {out / f"{stem}.json": json.dumps(body, indent=1) + "\n", out / f"{stem}.md": report}
    for path, text in files.items():
        temp = path.with_name(path.name + ".tmp")
        temp.write_text(text)
        os.replace(temp, path)
    return report


if __name__ == "__main__":
    sys.exit(main())
