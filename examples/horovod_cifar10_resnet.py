"""CIFAR-10 ResNet-18, Horovod style: the ImageNet ResNet-50 tutorial script, on ringtrain.

Mirrors Horovod's ``pytorch_imagenet_resnet50.py`` step by step: ``hvd.init()``, pin the device to the
local rank, scale the learning rate by the number of workers (and warm it up gradually, Goyal et al.
2017, "Accurate, Large Minibatch SGD"), wrap the optimizer in ``hvd.DistributedOptimizer`` (optionally
with fp16 compression and local gradient accumulation), broadcast the initial state from rank 0,
shard the data with ``DistributedSampler``, average the metrics with ``hvd.allreduce`` and write
checkpoints and TensorBoard logs from rank 0 only.

Data: the python version of CIFAR-10 (``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``)
under ``--data-dir``, or in ringtrain's cache (``--download`` fetches it there). Without either, the
script says so and trains on synthetic CIFAR-shaped images (3x32x32, 10 classes), so it runs from a
fresh clone. Run on two local processes:

    ringtrain run -np 2 python examples/horovod_cifar10_resnet.py --data-dir ~/data --epochs 2

and continue from the last checkpoint with ``--resume --epochs 4``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

import ringtrain as hvd
from ringtrain.exceptions import DataError
from ringtrain.workloads import get_workload

try:  # TensorBoard is optional: without it the script trains and just logs nothing.
    from torch.utils.tensorboard import SummaryWriter
except ImportError:
    SummaryWriter = None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CIFAR-10 ResNet-18 with the Horovod API of ringtrain")
    parser.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py/ (default: "
                        "ringtrain's cache, else synthetic CIFAR-shaped images)")
    parser.add_argument("--download", action="store_true", help="fetch CIFAR-10 into ringtrain's cache")
    parser.add_argument("--subset", type=int, default=None, help="train on this many images only")
    parser.add_argument("--log-dir", default="./logs", help="TensorBoard log folder")
    parser.add_argument("--checkpoint-format", default="./checkpoint-{epoch}.pth.tar",
                        help="checkpoint file name, formatted with the epoch number")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--batches-per-allreduce", type=int, default=1,
                        help="local batches accumulated before each allreduce")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    parser.add_argument("--val-batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--base-lr", type=float, default=0.0125, help="learning rate for a single worker")
    parser.add_argument("--warmup-epochs", type=float, default=5)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", type=float, default=5e-5, help="weight decay")
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


class Metric:
    """A running mean of a value, averaged over all workers at every update."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.total = torch.tensor(0.0)
        self.count = 0

    def update(self, value: torch.Tensor) -> None:
        # The same name on every worker pairs the values up; it can be reused once the call returns.
        self.total += hvd.allreduce(value.detach().cpu(), name=self.name)
        self.count += 1

    @property
    def avg(self) -> float:
        return (self.total / max(self.count, 1)).item()


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output.argmax(dim=1).eq(target).float().mean()


def images(args: argparse.Namespace) -> tuple[Dataset, Dataset]:
    """CIFAR-10 from --data-dir or the cache; synthetic CIFAR-shaped images when neither was asked for
    nor found (a fresh clone)."""
    try:
        return get_workload("cifar10").datasets(data_dir=args.data_dir, download=args.download,
                                                subset=args.subset)
    except DataError as exc:
        if args.data_dir is not None or args.download:  # asked for and missing: say which, no traceback
            sys.exit(f"error: {exc}")
    if hvd.rank() == 0:
        print("no CIFAR-10 in ringtrain's cache: training on synthetic CIFAR-shaped images instead. HINT: "
              "--data-dir DIR (holding cifar-10-batches-py/) or --download for the real ones", flush=True)
    return get_workload("synthetic", like="cifar10").datasets(subset=args.subset, seed=args.seed)


def adjust_learning_rate(args: argparse.Namespace, optimizer: torch.optim.Optimizer, epoch: int,
                         batch_idx: int, batches: int) -> None:
    """Gradual warm-up from the single-worker rate to size() times it, then step decay."""
    if epoch < args.warmup_epochs:
        progress = (epoch + (batch_idx + 1) / batches) / args.warmup_epochs
        lr_adj = (1 + progress * (hvd.size() - 1)) / hvd.size()
    elif epoch < 30:
        lr_adj = 1.0
    elif epoch < 60:
        lr_adj = 1e-1
    elif epoch < 80:
        lr_adj = 1e-2
    else:
        lr_adj = 1e-3
    for group in optimizer.param_groups:
        group["lr"] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj


def train(args: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          loader: DataLoader, sampler: DistributedSampler, epoch: int, device: torch.device,
          writer: SummaryWriter | None) -> None:
    model.train()
    sampler.set_epoch(epoch)  # a different shuffle each epoch, the same one on every worker
    train_loss, train_accuracy = Metric("train_loss"), Metric("train_accuracy")
    with tqdm(total=len(loader), desc=f"Train Epoch #{epoch + 1}", disable=hvd.rank() != 0) as bar:
        for batch_idx, (data, target) in enumerate(loader):
            adjust_learning_rate(args, optimizer, epoch, batch_idx, len(loader))
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            # One loader batch holds batches_per_allreduce sub-batches: their gradients add up
            # locally and the DistributedOptimizer allreduces once, at step().
            chunks = math.ceil(len(data) / args.batch_size)
            for i in range(0, len(data), args.batch_size):
                output = model(data[i:i + args.batch_size])
                loss = F.cross_entropy(output, target[i:i + args.batch_size])
                train_loss.update(loss)
                train_accuracy.update(accuracy(output, target[i:i + args.batch_size]))
                (loss / chunks).backward()
            optimizer.step()
            bar.set_postfix({"loss": f"{train_loss.avg:.4f}", "accuracy": f"{100 * train_accuracy.avg:.2f}%"})
            bar.update(1)
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1} train: loss {train_loss.avg:.4f} accuracy {train_accuracy.avg:.4f}",
              flush=True)
    if writer:
        writer.add_scalar("train/loss", train_loss.avg, epoch)
        writer.add_scalar("train/accuracy", train_accuracy.avg, epoch)


def validate(model: torch.nn.Module, loader: DataLoader, epoch: int, device: torch.device,
             writer: SummaryWriter | None) -> None:
    model.eval()
    val_loss, val_accuracy = Metric("val_loss"), Metric("val_accuracy")
    with torch.no_grad():
        for data, target in tqdm(loader, desc=f"Validate Epoch #{epoch + 1}", disable=hvd.rank() != 0):
            data, target = data.to(device), target.to(device)
            output = model(data)
            val_loss.update(F.cross_entropy(output, target))
            val_accuracy.update(accuracy(output, target))
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1} val: loss {val_loss.avg:.4f} accuracy {val_accuracy.avg:.4f}", flush=True)
    if writer:
        writer.add_scalar("val/loss", val_loss.avg, epoch)
        writer.add_scalar("val/accuracy", val_accuracy.avg, epoch)


def save_checkpoint(args: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    epoch: int) -> None:
    if hvd.rank() != 0:
        return
    path = Path(args.checkpoint_format.format(epoch=epoch + 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}
    # Write beside the target and rename: a crash mid-write never leaves a truncated checkpoint.
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one core per worker: several workers share a machine
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per process
        torch.cuda.manual_seed(args.seed)
    device = torch.device("cuda" if args.cuda else "cpu")

    # Rank 0 looks for the newest checkpoint and tells the others where to start.
    resume_from_epoch = 0
    if args.resume and hvd.rank() == 0:
        for try_epoch in range(args.epochs, 0, -1):
            if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
                resume_from_epoch = try_epoch
                break
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0,
                                      name="resume_from_epoch").item()

    workload = get_workload("cifar10")
    train_set, val_set = images(args)
    # Each loader batch feeds batches_per_allreduce sub-batches (see train()).
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_set, batch_size=args.batch_size * args.batches_per_allreduce,
                              sampler=train_sampler)
    val_sampler = DistributedSampler(val_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    val_loader = DataLoader(val_set, batch_size=args.val_batch_size, sampler=val_sampler)

    model = workload.model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size() * args.batches_per_allreduce,
                                momentum=args.momentum, weight_decay=args.wd)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.batches_per_allreduce)

    # Only rank 0 reads the checkpoint; the broadcasts below hand its state to everyone.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(args.checkpoint_format.format(epoch=resume_from_epoch), map_location=device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        print(f"resumed from checkpoint of epoch {resume_from_epoch}", flush=True)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    writer = SummaryWriter(args.log_dir) if hvd.rank() == 0 and SummaryWriter is not None else None
    if hvd.rank() == 0:
        global_batch = args.batch_size * args.batches_per_allreduce * hvd.size()
        print(f"{hvd.size()} workers, global batch {global_batch}, "
              f"{len(train_set)} training images, epochs {resume_from_epoch + 1}..{args.epochs}", flush=True)
    for epoch in range(resume_from_epoch, args.epochs):
        train(args, model, optimizer, train_loader, train_sampler, epoch, device, writer)
        validate(model, val_loader, epoch, device, writer)
        save_checkpoint(args, model, optimizer, epoch)
    if writer:
        writer.close()
    hvd.shutdown()


if __name__ == "__main__":
    main()
