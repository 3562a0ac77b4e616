"""An unmodified-style Horovod script that checkpoints every N steps and resumes: the restart tests' worker.

``python hvd_checkpoint.py DIR --steps S --every N [--step-seconds T]``: trains a small regression model
for S optimizer steps with ``hvd.DistributedOptimizer``; rank 0 writes ``DIR/ckpt-<step>.pt``
atomically every N steps; on start, rank 0 finds the newest checkpoint, every rank gets its step with
``hvd.broadcast`` and its weights and optimizer state with ``broadcast_parameters`` /
``broadcast_optimizer_state``. Prints ``resumed at step K (attempt A)`` when it resumed, and rank 0
writes ``DIR/result.json`` (final step, attempt, a weight checksum) when done. Batches depend only on
(step, rank), so a resumed run trains exactly what an uninterrupted one would. ``--step-seconds``
stands in for the compute of a real model (a tiny one takes microseconds).
"""

import argparse
import glob
import json
import os
import time

import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser()
parser.add_argument("folder")
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--every", type=int, default=20)
parser.add_argument("--step-seconds", type=float, default=0.0)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters())
truth = torch.linspace(-1.0, 1.0, 16)

start = 0
if hvd.rank() == 0:
    found = sorted(glob.glob(os.path.join(args.folder, "ckpt-*.pt")))
    if found:
        state = torch.load(found[-1], weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
start = int(hvd.broadcast(torch.tensor(start), root_rank=0, name="start_step").item())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
attempt = os.environ.get("RINGTRAIN_ATTEMPT", "?")
if start and hvd.rank() == 0:
    print(f"resumed at step {start} (attempt {attempt})", flush=True)

for step in range(start, args.steps):
    generator = torch.Generator().manual_seed(step * 1000 + hvd.rank())
    features = torch.randn(64, 16, generator=generator)
    targets = (features @ truth).unsqueeze(1)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(features), targets)
    loss.backward()
    optimizer.step()
    if args.step_seconds:
        time.sleep(args.step_seconds)
    done = step + 1
    if hvd.rank() == 0 and (done % args.every == 0 or done == args.steps):
        path = os.path.join(args.folder, f"ckpt-{done:06d}.pt")
        temp = os.path.join(args.folder, f".ckpt-{done:06d}.tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done}, temp)
        os.replace(temp, path)

checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
if hvd.rank() == 0:
    temp = os.path.join(args.folder, ".result.tmp")
    with open(temp, "w") as fp:
        json.dump({"step": args.steps, "attempt": attempt, "checksum": checksum,
                   "loss": float(loss.detach())}, fp)
    os.replace(temp, os.path.join(args.folder, "result.json"))
    print(f"done: {args.steps} steps, attempt {attempt}, loss {float(loss.detach()):.5f}", flush=True)
hvd.shutdown()
