"""An elastic MNIST job for the tests, with the API calls of Horovod's elastic MNIST example.

Like ``examples/elastic/pytorch/pytorch_mnist_elastic.py``: ``hvd.init()``, a CNN with an SGD optimizer
whose learning rate is scaled by ``hvd.size()``, ``hvd.DistributedOptimizer``, ``hvd.elastic.TorchState``
holding model, optimizer, epoch and batch, a reset callback that rescales the learning rate,
``@hvd.elastic.run`` around the training loop and a ``state.commit()`` every few batches. Unlike the
example it shards the data with ``hvd.elastic.ElasticSampler`` (kept in the state), and it counts how
often the committed training saw each sample: ``state.seen`` (a plain attribute, so it is restored
and synced with the rest) adds up every rank's batch indices through ``hvd.allreduce``.

Run it under ``ringtrain run --min-np ... --host-discovery-script ...``. It writes into ``--out``,
each file atomically (temp file + rename):

- ``progress-<worker>.json`` after every commit (worker id, pid, host, rank, size, epoch, batch, the
  process's niceness);
- ``epoch-<e>.json`` (rank 0) at the end of epoch e: the per-sample counts and the size then;
- ``result.json`` (rank 0) at the end: epochs, final size, learning rate, generations seen.

Two gates let a test act at a known point, waiting on a file instead of sleeping:

- ``--stall-host H --stall-after N --stall-count K``: a worker on host H (``HOROVOD_HOSTNAME``) that
  reaches its N-th commit writes ``stalled-<worker>.json`` (with its pid) and waits there for
  ``release-<worker>``; the test kills it meanwhile. At most K workers ever stall.
- ``--pause-at-size N``: rank 0, just before its first commit in a group of N workers, writes
  ``paused.json`` and waits for ``resume`` (the test changes the hosts meanwhile, and the commit then
  sees the update). It pauses once per job.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F  # the examples' spelling
from torch import nn

from ringtrain.workloads.idx import read_idx
from ringtrain.workloads.mnist import EMBEDDED_MNIST

parser = argparse.ArgumentParser(description="elastic MNIST for the tests")
parser.add_argument("--out", required=True)
parser.add_argument("--data-dir", default=str(EMBEDDED_MNIST))
parser.add_argument("--samples", type=int, default=480)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--commit-every", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--stall-host")
parser.add_argument("--stall-after", type=int, default=3)
parser.add_argument("--stall-count", type=int, default=1)
parser.add_argument("--pause-at-size", type=int)
args = parser.parse_args()
out = Path(args.out)
worker = os.environ.get("RINGTRAIN_ELASTIC_WORKER", "static")

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)


def write_json(path: Path, body: dict) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(body))
    os.replace(temporary, path)


images = read_idx(Path(args.data_dir) / "train-images-idx3-ubyte.gz", expect_ndim=3)[:args.samples]
labels = read_idx(Path(args.data_dir) / "train-labels-idx1-ubyte.gz", expect_ndim=1)[:args.samples].long()
features = ((images.float() / 255.0 - 0.1307) / 0.3081).unsqueeze(1)
dataset = torch.utils.data.TensorDataset(features, labels, torch.arange(len(labels)))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
commits = 0


def on_state_reset() -> None:
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


def pause() -> None:
    """The pause gate, just before a commit: a host update heard meanwhile interrupts that commit."""
    if args.pause_at_size and hvd.rank() == 0 and hvd.size() == args.pause_at_size \
            and not (out / "paused.json").exists():
        write_json(out / "paused.json", {"pid": os.getpid(), "size": hvd.size()})
        while not (out / "resume").exists():
            time.sleep(0.05)


def gates() -> None:
    """The test's hooks after each commit (see the module docstring)."""
    global commits
    commits += 1
    write_json(out / f"progress-{worker}.json", {
        "worker": worker, "pid": os.getpid(), "host": os.environ.get("HOROVOD_HOSTNAME"), "rank": hvd.rank(),
        "size": hvd.size(), "epoch": state.epoch, "batch": state.batch, "commits": commits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0)})
    if (args.stall_host and os.environ.get("HOROVOD_HOSTNAME") == args.stall_host
            and commits == args.stall_after and len(list(out.glob("stalled-*.json"))) < args.stall_count):
        write_json(out / f"stalled-{worker}.json", {"pid": os.getpid(), "worker": worker})
        while not (out / f"release-{worker}").exists():
            time.sleep(0.05)


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while state.epoch < args.epochs:
        state.model.train()
        for batch_idx, (data, target, index) in enumerate(loader):
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            mine = torch.bincount(index, minlength=len(dataset))
            state.seen = state.seen + hvd.allreduce(mine, op=hvd.Sum, name="seen")
            state.sampler.record_batch(batch_idx, args.batch_size)
            state.batch += 1
            if state.batch % args.commit_every == 0:
                pause()
                state.commit()
                gates()
        if hvd.rank() == 0:
            write_json(out / f"epoch-{state.epoch}.json", {"seen": state.seen.tolist(), "size": hvd.size()})
        state.epoch += 1
        state.batch = 0
        state.seen = torch.zeros(len(dataset), dtype=torch.int64)
        state.sampler.set_epoch(state.epoch)
        state.commit()
        gates()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0,
                               seen=torch.zeros(len(dataset), dtype=torch.int64))
state.register_reset_callbacks([on_state_reset])
train(state)
if hvd.rank() == 0:
    write_json(out / "result.json", {"epochs": state.epoch, "size": hvd.size(),
                                     "lr": optimizer.param_groups[0]["lr"], "worker": worker,
                                     "generation": os.environ.get("RINGTRAIN_ELASTIC_GENERATION")})
