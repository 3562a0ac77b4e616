"""The job of the fault-injection tests: steps of allreduces across the ranks, held at a gate for the fault.

``python fault_job.py DIR [--steps N] [--hold-at K] [--floats F] [--step-seconds T]``. Every step, each rank
allreduces F floats (by default as many as the gradients of the MNIST CNN these tests used to train) and
checks the sum; rank 0 prints ``step S done`` every 4 steps. ``--steps 0`` runs until a fault ends the job.

What a fault does to a job is decided by its collectives, its heartbeats and its launcher, not by the
arithmetic between them; a CNN's steps cost each rank seconds of CPU and prove nothing more here. Each
step sleeps ``--step-seconds`` in place of that compute, so a rank is as often in a collective as in
"compute" when a fault lands.

With ``--hold-at K`` the ranks, after step K, go on exchanging allreduces of the same size (traffic in
flight across the link, as in training) without counting steps, until rank 0 sees the file
``DIR/release``; rank 0 prints ``holding at step K (attempt A)`` on entering the hold. A test cuts the
link meanwhile: the job cannot finish before the fault however loaded the machine is, and the fixed step
count at the end shows that no step was lost. Rank 0's flag travels in the allreduce itself, so every
rank leaves the hold after the same round. Rank 0 ends with ``final: N steps on S ranks``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

#: Parameters of the MNIST CNN (ringtrain.workloads.models.mnist_cnn): one gradient allreduce per step.
CNN_FLOATS = 21_840


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--steps", type=int, default=0, help="steps to run; 0: until a fault ends the job")
    parser.add_argument("--hold-at", type=int, default=None)
    parser.add_argument("--floats", type=int, default=CNN_FLOATS)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ringtrain as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    expected_base = size * (size - 1) / 2

    def exchange(step: int, flag: float = 0.0) -> float:
        """One allreduce of ``--floats`` values, checked; returns the sum of the ranks' flags."""
        payload = torch.full((args.floats + 1,), float(rank + step))
        payload[-1] = flag
        summed = hvd.allreduce(payload, op=hvd.Sum, name="fault_job.step")
        expected = expected_base + size * step
        if not torch.equal(summed[:-1], torch.full((args.floats,), expected)):
            raise RuntimeError(f"step {step}: allreduce gave {summed[:3].tolist()}, expected {expected}")
        return float(summed[-1])

    step = 0
    while args.steps == 0 or step < args.steps:
        exchange(step)
        time.sleep(args.step_seconds)
        step += 1
        if rank == 0 and step % 4 == 0:
            print(f"step {step} done", flush=True)
        if step == args.hold_at:
            if rank == 0:
                attempt = os.environ.get("RINGTRAIN_ATTEMPT", "?")
                print(f"holding at step {step} (attempt {attempt})", flush=True)
            released = 0.0
            while not released:
                released = exchange(step, float(rank == 0 and (args.dir / "release").exists()))
                time.sleep(args.step_seconds)
    if rank == 0:
        print(f"final: {step} steps on {size} ranks", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
