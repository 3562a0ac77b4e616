"""Train Horovod's MNIST CNN across hosts: the script a multi-node ``ringtrain run`` starts.

    ringtrain run -np 2 -H hostA:1,hostB:1 -i ~/.ssh/id_ed25519 \\
        python examples/mnist_cnn_multihost.py --train-samples 2048

(``-np 2`` alone runs both ranks on this machine.) Each rank trains on its own shard of the first
``--train-samples`` images of real MNIST: the IDX files in ``--data-dir`` when given, else ringtrain's
cache, else the 10,000/2,000-image subset embedded in ringtrain. Gradients are averaged by
``hvd.DistributedOptimizer``, and the test accuracy is averaged over all ranks at the end. Every rank
first prints where it runs, so a launcher's host mapping can be seen; rank 0 prints the loss every
``--log-every`` steps and a final summary line.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import ringtrain as hvd
from ringtrain.workloads import get_workload
from ringtrain.workloads.idx import read_idx
from ringtrain.workloads.models.mnist_cnn import HorovodMnistNet


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder with the four MNIST *-idx?-ubyte.gz files (default: ringtrain's cache, "
                             "else the MNIST subset embedded in ringtrain)")
    parser.add_argument("--train-samples", type=int, default=2048, help="first N training images used")
    parser.add_argument("--test-samples", type=int, default=1000, help="first N test images evaluated")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01, help="per-rank learning rate (scaled by size)")
    parser.add_argument("--log-every", type=int, default=10, help="rank 0 logs every N steps")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def load(data_dir: Path | None, split: str, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` images of a split, scaled and normalised as in the Horovod example."""
    if data_dir is None:  # ringtrain's cache, else its embedded subset: a fresh clone needs no download
        train, test = get_workload("mnist").datasets()  # normalised alike (mean 0.1307, sd 0.3081)
        chosen = train if split == "train" else test
        return chosen.features[:count], chosen.targets[:count].long()
    prefix = "train" if split == "train" else "t10k"
    images_file = data_dir / f"{prefix}-images-idx3-ubyte.gz"
    if not images_file.exists():
        sys.exit(f"error: {images_file} not found. HINT: pass --data-dir <folder with the MNIST IDX files>, "
                 "or leave it out to use the MNIST subset embedded in ringtrain")
    images = read_idx(images_file, expect_ndim=3)[:count].float().div(255).sub(0.1307).div(0.3081)
    labels = read_idx(data_dir / f"{prefix}-labels-idx1-ubyte.gz", expect_ndim=1)[:count].long()
    return images.unsqueeze(1), labels


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    print(f"rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()} (local rank {hvd.local_rank()})",
          flush=True)

    images, labels = load(args.data_dir, "train", args.train_samples)
    # Each rank takes every size-th image: disjoint shards of equal length.
    images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]

    model = HorovodMnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    step = 0
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            batch = order[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = F.nll_loss(model(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            step += 1
            if hvd.rank() == 0 and step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)

    test_images, test_labels = load(args.data_dir, "test", args.test_samples)
    test_images, test_labels = test_images[hvd.rank()::hvd.size()], test_labels[hvd.rank()::hvd.size()]
    model.eval()
    with torch.no_grad():
        output = model(test_images)
        sums = torch.tensor([F.nll_loss(output, test_labels, reduction="sum").item(),
                             (output.argmax(1) == test_labels).sum().item(), float(len(test_labels))])
    totals = hvd.allreduce(sums, op=hvd.Sum, name="test.totals")
    if hvd.rank() == 0:
        print(f"final: {step} steps on {hvd.size()} ranks, test loss {totals[0] / totals[2]:.4f}, "
              f"test accuracy {totals[1] / totals[2]:.4f}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
