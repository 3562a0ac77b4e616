"""The DDP tutorial's ``Trainer``-class script (``multigpu_torchrun.py``), rebuilt on ringtrain's Trainer.

The tutorial writes the Trainer itself: process-group setup, a ``DistributedSampler``, the DDP
wrapper, the epoch loop, a snapshot every ``SAVE_EVERY`` epochs and its resume. Here all of that is
``ringtrain.train.Trainer`` with ``strategy="ddp"``; the script keeps only what is specific to the
job: the data, the model, the optimizer and the loss. On top, the Trainer evaluates on the test set,
averages the metrics over all ranks, writes snapshots atomically (from rank 0) and resumes to the
exact step, with the random state of every rank.

Run with torchrun, on one machine or one line per node (add ``--nnodes``/``--rdzv-*`` for many):

    python -m torch.distributed.run --nproc-per-node 2 --standalone examples/ddp_trainer.py 5 1
    ringtrain run -np 2 python examples/ddp_trainer.py 5 1

Run the same line again after a crash: training continues from the newest snapshot in
``--snapshot-dir``.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import Dataset

from ringtrain.train import Trainer, TrainerConfig
from ringtrain.workloads import get_workload


def load_train_objs(data_dir: str | None, subset: int | None) -> tuple[Dataset, Dataset, nn.Module,
                                                                     torch.optim.Optimizer, nn.Module]:
    """The job: MNIST (ringtrain ships a real subset, so this works offline), a small CNN, Adam."""
    workload = get_workload("mnist")
    train_set, test_set = workload.datasets(data_dir=data_dir, subset=subset)
    model = workload.model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train_set, test_set, model, optimizer, workload.loss()


def main(total_epochs: int, save_every: int, batch_size: int, snapshot_dir: str, data_dir: str | None,
         subset: int | None) -> None:
    train_set, test_set, model, optimizer, loss_fn = load_train_objs(data_dir, subset)
    config = TrainerConfig(strategy="ddp", epochs=total_epochs, batch_size=batch_size, save_every=save_every,
                           snapshot_dir=snapshot_dir, threads=1)
    # The Trainer joins the process group (gloo on CPU, NCCL on GPU) and leaves it on close.
    with Trainer(model, optimizer, loss_fn, train_set, test_set, config) as trainer:
        trainer.train()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int,
                        help="Input batch size on each device (default: 32)")
    parser.add_argument("--snapshot-dir", default="snapshots", help="folder of the snapshots")
    parser.add_argument("--data-dir", default=None,
                        help="folder with the MNIST files (default: the built-in subset)")
    parser.add_argument("--subset", type=int, default=None, help="use at most this many images")
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size, args.snapshot_dir, args.data_dir, args.subset)
