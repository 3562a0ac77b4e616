"""What torch.distributed allows when two ranks use one GPU: NCCL, and gloo with CUDA tensors.

    python3 benchmarks/gpu/probe_shared_gpu.py --out DIR               # on a GPU machine (a minute)
    python3 benchmarks/gpu/probe_shared_gpu.py --device cpu --out DIR  # the same probes on CPU tensors

Two processes both on ``cuda:0`` build (1) an NCCL group and run one allreduce (NCCL >= 2.5 refuses:
``ncclInvalidUsage``, "Duplicate GPU detected"), and (2) a gloo group, through which each collective
(allreduce per dtype, broadcast, allgather, alltoall_base, reduce_scatter) is tried on CUDA tensors.
Every outcome (ok, the error's first line, or "hung") goes to ``probe_shared_gpu.json``; docs/gpu.md
records what was found. This is what ringtrain's engine works around for ranks that share a GPU (its
CUDA collectives go through host memory) and why the DDP strategy uses gloo there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # NCCL's reason ("Duplicate GPU detected ...") comes after torch's own first line
    useful = [line for line in lines if "Duplicate" in line or "ncclInvalidUsage" in line]
    return " | ".join(([lines[0]] if lines else []) + useful[:2])[:400]


def _try(results: dict[str, str], name: str, fn: Any) -> None:
    try:
        fn()
        results[name] = "ok"
    except Exception as exc:  # every outcome is a finding
        results[name] = _first_line(exc)


def _rank(rank: int, port: int, backend: str, device_kind: str, queue: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    results: dict[str, str] = {}
    try:
        device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            group: Any = dist.ProcessGroupNCCL(store, rank, 2, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = datetime.timedelta(seconds=60)
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            group = dist.ProcessGroupGloo(store, rank, 2, options)

        def allreduce(dtype: torch.dtype) -> None:
            t = torch.full((1000,), float(rank + 1), dtype=dtype, device=device)
            group.allreduce([t]).wait()
            torch.cuda.synchronize() if device.type == "cuda" else None
            assert t.float().eq(3.0).all().item(), f"wrong sum {t[:3].tolist()}"

        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
            _try(results, f"allreduce[{str(dtype).replace('torch.', '')}]", lambda d=dtype: allreduce(d))
            if backend == "nccl" and results["allreduce[float32]"] != "ok":
                break  # the group itself is refused: the rest would say the same

        def broadcast() -> None:
            t = torch.full((100,), float(rank), device=device)
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = 1, 0
            group.broadcast([t], opts).wait()
            assert t.eq(1.0).all().item()

        def allgather() -> None:
            t = torch.full((10,), float(rank), device=device)
            out = [torch.empty(10, device=device) for _ in range(2)]
            group.allgather([out], [t]).wait()
            assert [o[0].item() for o in out] == [0.0, 1.0]

        def alltoall() -> None:
            t = torch.full((4,), float(rank), device=device)
            out = torch.empty(4, device=device)
            group.alltoall_base(out, t, [2, 2], [2, 2], dist.AllToAllOptions()).wait()
            assert out.tolist() == [0.0, 0.0, 1.0, 1.0]

        def reduce_scatter() -> None:
            inputs = [torch.full((3,), float(rank + 1), device=device) for _ in range(2)]
            out = torch.empty(3, device=device)
            group.reduce_scatter([out], [inputs], dist.ReduceScatterOptions()).wait()
            assert out.eq(3.0).all().item()

        if backend == "gloo" or results.get("allreduce[float32]") == "ok":
            for name, fn in (("broadcast", broadcast), ("allgather", allgather), ("alltoall_base", alltoall),
                             ("reduce_scatter", reduce_scatter)):
                _try(results, name, fn)
    except Exception as exc:
        results["setup"] = _first_line(exc)
        results["traceback"] = traceback.format_exc()[-2000:]
    queue.put((rank, results))


def probe(backend: str, device_kind: str) -> dict[str, Any]:
    """Run one probe in two fresh processes; returns rank 0's and rank 1's outcomes."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(rank, port, backend, device_kind, queue), daemon=True)
             for rank in range(2)]
    for proc in procs:
        proc.start()
    found: dict[int, dict[str, str]] = {}
    try:
        for _ in procs:
            rank, results = queue.get(timeout=PROBE_TIMEOUT_S)
            found[rank] = results
    except Exception:  # queue.Empty: a rank hung
        pass
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    outcome: dict[str, Any] = {"backend": backend, "device": device_kind}
    for rank in range(2):
        outcome[f"rank{rank}"] = found.get(rank, {"setup": f"hung or died (no answer in {PROBE_TIMEOUT_S} s, "
                                                           f"exit code {procs[rank].exitcode})"})
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                            "torch": torch.__version__, "cuda": torch.version.cuda,
                            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                            "nccl": (".".join(map(str, torch.cuda.nccl.version()))
                                     if torch.cuda.is_available() and dist.is_nccl_available() else None),
                            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_"))}}
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU. HINT: --device cpu runs the probes on CPU tensors")
    probes = [probe("gloo", args.device)]
    if args.device == "cuda":
        probes.insert(0, probe("nccl", "cuda"))
    body = {"machine": info, "probes": probes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "probe_shared_gpu.json"
    path.write_text(json.dumps(body, indent=1) + "\n")
    for p in probes:
        print(f"{p['backend']} with two ranks on one {p['device']} device:")
        for key, value in p["rank0"].items():
            if key != "traceback":
                print(f"  {key:<22} {value}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
