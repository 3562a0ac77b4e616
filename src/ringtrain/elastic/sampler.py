"""``ElasticSampler``: a distributed sampler that remembers how far the epoch got.

After a reset (new world size, new rank) the rest of the epoch is re-partitioned over the current
ranks, skipping the samples that were already processed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from ringtrain import mpi_ops


class ElasticSampler(torch.utils.data.Sampler):
    """Deterministically shuffled indices of ``dataset``, split over the ranks of the job.

    Shuffling uses ``random.Random(seed + epoch)``, so every rank computes the same permutation.
    Call ``record_batch(batch_idx, batch_size)`` after each batch and ``set_epoch(e)`` at the start of
    each epoch; ``state_dict()`` / ``load_state_dict()`` carry ``{epoch, processed_num}``.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first sample."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one batch of ``batch_size`` per rank as processed (by every rank)."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, int]:
        """``{'epoch': ..., 'processed_num': ...}``."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict``, partitioning the rest of the epoch over the current ranks."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-read rank and size and recompute this rank's share of the unprocessed samples."""
        self.num_replicas = mpi_ops.size()
        self.rank = mpi_ops.rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        # Pad by wrapping around so every rank gets the same number of samples.
        while indices and len(indices) < self.total_size:
            indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticSampler"]
