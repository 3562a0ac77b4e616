"""The job the attack suite attacks: a Horovod-API job that stops at fixed points so an outsider can act.

``python attack_target.py DIR [--wait-start] [--steps N]``. Each rank, in order:

1. with ``--wait-start``, waits until ``DIR/start`` exists (an outsider sets up before ``hvd.init()``);
2. ``hvd.init()`` and one allreduce, then writes ``DIR/ready.<rank>`` (pid and host, atomically);
3. waits until ``DIR/go`` exists (the outsider attacks meanwhile);
4. trains: ``--steps`` rounds of an allreduce, a ``broadcast_object`` and an ``allgather_object``, each
   result checked; writes ``DIR/done.<rank>``.

A rank that sees a wrong value raises, so a job an outsider redirected or fed data fails loudly.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _wait_for(path: Path, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:g} s")
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--wait-start", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ringtrain as hvd

    if args.wait_start:
        _wait_for(args.dir / "start")
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="ready.sum")
    assert total.item() == size * (size - 1) / 2, total
    _write(args.dir / f"ready.{rank}", {"pid": os.getpid(), "host": socket.gethostname()})
    _wait_for(args.dir / "go")
    for step in range(args.steps):
        summed = hvd.allreduce(torch.full((1000,), float(rank + step)), op=hvd.Sum, name="train.sum")
        expected = sum(r + step for r in range(size))
        if not torch.equal(summed, torch.full((1000,), float(expected))):
            raise RuntimeError(f"step {step}: allreduce gave {summed[:3].tolist()}, expected {expected}")
        sent = hvd.broadcast_object({"step": step, "from": 0} if rank == 0 else None, root_rank=0,
                                    name="train.object")
        if sent != {"step": step, "from": 0}:
            raise RuntimeError(f"step {step}: broadcast_object gave {sent!r}")
        gathered = hvd.allgather_object((rank, step), name="train.objects")
        if gathered != [(r, step) for r in range(size)]:
            raise RuntimeError(f"step {step}: allgather_object gave {gathered!r}")
    _write(args.dir / f"done.{rank}", {"steps": args.steps})
    sys.stdout.write(f"rank {rank} of {size} trained {args.steps} steps\n")
    sys.stdout.flush()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
