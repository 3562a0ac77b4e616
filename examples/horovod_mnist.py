"""Horovod's PyTorch MNIST tutorial, step by step, as an unmodified Horovod script.

It trains with ``horovod.torch`` alone, so it runs under real Horovod too
(``horovodrun -np 2 python horovod_mnist.py --data-dir DIR``). On ringtrain::

    ringtrain run -np 2 python examples/horovod_mnist.py --epochs 2
    python examples/horovod_mnist.py --num-proc 2 --epochs 2                # horovod.run
    ringtrain bench --np 1,2 -- python examples/horovod_mnist.py --epochs 2 # the scaling table

The data are the four MNIST IDX ``.gz`` files (train/t10k images and labels) read with gzip and
numpy, so neither torchvision nor a download is needed. ``--data-dir DIR`` points at them; where DIR
(default ``./data``) does not hold them, the script says so and uses the real 10k/2k MNIST subset
that ringtrain embeds (it needs ringtrain installed then, not a download).

Two small additions to the tutorial, both optional at run time: the embedded-data fallback above,
and one ``ringtrain.bench.report`` call per epoch (items, steps and seconds of its training, not of
start-up or testing), which ``ringtrain bench`` times the script by (docs/bench.md). It prints its
``RINGTRAIN_BENCH`` line only when ``ringtrain bench`` runs the script; in any other run it prints
nothing. Without ringtrain installed, neither happens.

The eight steps of the Horovod tutorial are marked ``# Step N`` below.
"""

import argparse
import gzip
import os
import sys
import time

import horovod
import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # ringtrain bench's timing line: printed only when `ringtrain bench` runs this script
    from ringtrain.bench import parameters_digest, report
except ImportError:  # real Horovod without ringtrain: nothing reads the line
    report = None

FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
MEAN, STD = 0.1307, 0.3081


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Horovod PyTorch MNIST example")
    parser.add_argument("--batch-size", type=int, default=64, help="input batch size for training")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing")
    parser.add_argument("--epochs", type=int, default=10, help="number of epochs to train")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (per rank; scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--log-interval", type=int, default=10, help="batches between progress lines")
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--use-mixed-precision", action="store_true", default=False,
                        help="use mixed precision (autocast + GradScaler) on CUDA")
    parser.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm")
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                        help="apply gradient predivide factor in optimizer")
    parser.add_argument("--data-dir", default="./data",
                        help="folder with the MNIST IDX .gz files (where it lacks them: ringtrain's embedded "
                             "10k/2k subset)")
    parser.add_argument("--train-samples", type=int, default=0,
                        help="use only the first N training images (0: all); for quick smoke runs")
    parser.add_argument("--checkpoint", default="", help="rank 0 saves the model here after each epoch")
    parser.add_argument("--num-proc", type=int, help="start this many processes with horovod.run")
    parser.add_argument("--hosts", help="hosts for horovod.run, e.g. localhost:2")
    parser.add_argument("--communication", default="gloo", choices=("gloo", "mpi"),
                        help="collective backend for horovod.run")
    return parser.parse_args(argv)


def read_idx(path):
    """An IDX file as a numpy array: 4-byte magic (dtype code, ndim), big-endian dims, raw data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def resolve_data_dir(data_dir, rank):
    """``data_dir`` when it holds the four MNIST files, else the real subset ringtrain embeds."""
    wanted = [name for pair in FILES.values() for name in pair]
    if all(os.path.isfile(os.path.join(data_dir, name)) for name in wanted):
        return data_dir
    try:
        from ringtrain.workloads.mnist import EMBEDDED_MNIST
    except ImportError:
        sys.exit(f"error: {data_dir!r} does not hold the MNIST files ({', '.join(wanted)}). HINT: pass "
                 "--data-dir with the folder that holds them, or install ringtrain for its embedded subset.")
    if rank == 0:
        print(f"note: {data_dir!r} does not hold the MNIST files; using ringtrain's embedded subset "
              "(10,000 training and 2,000 test images of the real MNIST)", file=sys.stderr, flush=True)
    return str(EMBEDDED_MNIST)


def load_split(data_dir, split, limit=0):
    images_file, labels_file = FILES[split]
    images = read_idx(os.path.join(data_dir, images_file))
    labels = read_idx(os.path.join(data_dir, labels_file))
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.copy()).float().div_(255.0).sub_(MEAN).div_(STD)).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def metric_average(val, name):
    # Step 8 (metrics): average a scalar over all ranks.
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def train_epoch(epoch, model, optimizer, train_loader, train_sampler, scaler, args, device):
    model.train()
    # Horovod: set epoch to sampler for shuffling.
    train_sampler.set_epoch(epoch)
    items = 0
    for batch_idx, (data, target) in enumerate(train_loader):
        items += len(data)
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        if scaler is not None:
            with torch.autocast(device_type=device.type, dtype=torch.float16):
                loss = F.nll_loss(model(data), target)
            scaler.scale(loss).backward()
            # Make sure all async allreduces are done, then unscale the averaged gradients.
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
        else:
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            # Horovod: use train_sampler to determine the number of examples in this worker's partition.
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)} "
                  f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the epoch ends when its last step's work does, not its launch
    return items, len(train_loader)


def test(model, test_loader, test_sampler, device):
    model.eval()
    test_loss, test_accuracy = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1)
            test_accuracy += pred.eq(target).float().sum().item()
    # Horovod: use test_sampler to determine the number of examples in this worker's partition,
    # then average the metrics across workers.
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n",
              flush=True)
    return test_accuracy


def main(args):
    # Step 1: initialize Horovod.
    hvd.init()
    torch.manual_seed(args.seed)
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    if use_cuda:
        # Step 2: pin each process to one GPU (its local rank).
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)
        device = torch.device("cuda", hvd.local_rank())
    else:
        # Horovod: limit the number of CPU threads per process.
        torch.set_num_threads(1)
        device = torch.device("cpu")

    # Step 6 (data): each rank reads its own shard of the data.
    data_dir = resolve_data_dir(args.data_dir, hvd.rank())
    train_dataset = load_split(data_dir, "train", args.train_samples)
    test_dataset = load_split(data_dir, "test")
    train_sampler = DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net().to(device)
    # Step 3: scale the learning rate by the number of workers. Adasum needs no scaling on CPU; on GPUs
    # each host first averages its ranks' updates, so Horovod scales by the ranks of one host.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    if args.use_adasum and use_cuda and hvd.nccl_built():
        lr_scaler = hvd.local_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Step 5: start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Step 4: wrap the optimizer so gradients are averaged across ranks (fp16 on the wire if asked).
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)
    scaler = torch.amp.GradScaler("cuda") if args.use_mixed_precision and use_cuda else None

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        items, steps = train_epoch(epoch, model, optimizer, train_loader, train_sampler, scaler, args, device)
        if report is not None:  # this rank's epoch for ringtrain bench; the digest: its replicas agree
            report(items=items, seconds=time.perf_counter() - start, steps=steps, epoch=epoch,
                   rank=hvd.rank(), world_size=hvd.size(), parameters_digest=parameters_digest(model))
        accuracy = test(model, test_loader, test_sampler, device)
        # Step 7: save checkpoints on rank 0 only, so workers do not overwrite each other.
        if args.checkpoint and hvd.rank() == 0:
            torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       args.checkpoint)
    return accuracy


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.num_proc:
        # Horovod's Python API: start the workers from here.
        hosts = arguments.hosts or f"localhost:{arguments.num_proc}"
        horovod.run(main, args=(arguments,), np=arguments.num_proc, hosts=hosts,
                    use_gloo=arguments.communication == "gloo", use_mpi=arguments.communication == "mpi")
    else:
        main(arguments)
