"""Snapshots every N epochs, resumed after a crash: the DDP tutorial's ``multigpu_torchrun.py``.

The tutorial's hand-written ``Trainer`` class, kept as it is (torch DDP, a ``DistributedSampler``, a
snapshot every ``SAVE_EVERY`` epochs, automatic resume), with three changes that make it safe to use:

* ranks come from ``ringtrain.env``, so the same script runs under torchrun, ``ringtrain run``,
  Slurm or mpirun, on CPUs (gloo) or GPUs (NCCL);
* only global rank 0 writes the snapshot, through ``ringtrain.train.SnapshotManager``: atomically
  (a kill mid-write leaves the previous one), checked against the model on load, the last two kept;
* the snapshot holds the optimizer too and counts *finished* epochs, so a resumed run repeats none.

Every rank reads the snapshot on start, so the snapshot folder must be one that every node sees.

Run two processes for 10 epochs, a snapshot every 2; kill it and run the same line again to resume:

    ringtrain run -np 2 python examples/multigpu.py 10 2
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/multigpu.py 10 2
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from ringtrain.env import detect_environment
from ringtrain.train import SnapshotManager
from ringtrain.train.snapshots import model_fingerprint
from ringtrain.workloads import get_workload


def ddp_setup() -> tuple[int, int, torch.device]:
    """Join the process group; returns (global rank, local rank, this process's device)."""
    placement = detect_environment().placement()
    os.environ.setdefault("MASTER_ADDR", placement.main_address)
    os.environ.setdefault("MASTER_PORT", str(placement.main_port))
    if torch.cuda.is_available():
        torch.cuda.set_device(placement.local_rank)
        device = torch.device("cuda", placement.local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            rank=placement.rank, world_size=placement.world_size)
    return placement.rank, placement.local_rank, device


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer,
                 save_every: int, snapshot_dir: str, rank: int, device: torch.device) -> None:
        self.rank = rank
        self.device = device
        self.model = model.to(device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshots = SnapshotManager(snapshot_dir, keep_last=2)
        self.fingerprint = model_fingerprint(model)  # a snapshot of another model is refused
        self.epochs_run = 0
        if self.snapshots.latest() is not None:
            self._load_snapshot()
        # DDP broadcasts rank 0's weights at construction, so every rank starts from the snapshot.
        self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _load_snapshot(self) -> None:
        snapshot = self.snapshots.load(self.snapshots.latest(), self.fingerprint)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        if self.rank == 0:
            print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        self.train_data.sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for source, targets in self.train_data:
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
            total += torch.tensor([loss, 1.0])
        dist.all_reduce(total)  # the mean loss over every batch of every rank
        if self.rank == 0:
            batch_size = self.train_data.batch_size
            print(f"Epoch {epoch} | Batchsize: {batch_size} | Steps: {len(self.train_data)} | "
                  f"Loss: {total[0] / total[1]:.4f}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
            "fingerprint": self.fingerprint,
        }
        # Files are named by a counter that only grows: here, the number of finished epochs.
        path = self.snapshots.save(snapshot, step=epoch + 1)
        print(f"Epoch {epoch} | Training snapshot saved at {path}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            finished = epoch + 1
            if self.rank == 0 and (finished % self.save_every == 0 or finished == max_epochs):
                self._save_snapshot(epoch)


def load_train_objs(data_dir: str | None,
                    subset: int) -> tuple[Dataset, torch.nn.Module, torch.optim.Optimizer]:
    workload = get_workload("mnist")
    train_set, _ = workload.datasets(data_dir=data_dir, subset=subset)
    model = workload.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    return train_set, model, optimizer


def main(total_epochs: int, save_every: int, batch_size: int, snapshot_dir: str,
         data_dir: str | None, subset: int) -> None:
    torch.set_num_threads(1)  # several processes share the machine's cores
    rank, _, device = ddp_setup()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP checks them anyway)
    dataset, model, optimizer = load_train_objs(data_dir, subset)
    train_data = DataLoader(dataset, batch_size=batch_size, shuffle=False,
                            sampler=DistributedSampler(dataset))
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_dir, rank, device)
    trainer.train(total_epochs)
    # Free the DDP wrapper before its process group: one that outlives a gloo group can deadlock in
    # the group's destructor.
    del trainer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int,
                        help="Input batch size on each device (default: 32)")
    parser.add_argument("--snapshot-dir", default="snapshots", help="folder of the snapshots")
    parser.add_argument("--data-dir", default=None,
                        help="folder with the MNIST files (default: the built-in set)")
    parser.add_argument("--subset", type=int, default=2048, help="training images to use")
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size, args.snapshot_dir, args.data_dir, args.subset)
