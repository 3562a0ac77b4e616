"""Data loading for the Trainer: sharded, resumable mid-epoch, whole-batch indexing where possible."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler


class ResumableSampler(Sampler[int]):
    """A ``DistributedSampler`` that can start ``skip`` items into its epoch (a resumed snapshot)."""

    def __init__(self, inner: DistributedSampler) -> None:
        self.inner = inner
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (the same order on every run with the same seed)."""
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)


class _WholeBatches(Dataset):
    """Index a dataset holding whole tensors (``.features``, ``.targets``) with a list of indices at once."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: Sequence[int]) -> tuple[Any, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        features = self.dataset.features
        if isinstance(features, tuple):
            return tuple(f[index] for f in features), self.dataset.targets[index]
        return features[index], self.dataset.targets[index]


def _holds_whole_tensors(dataset: Any) -> bool:
    return isinstance(getattr(dataset, "features", None), torch.Tensor | tuple) and isinstance(
        getattr(dataset, "targets", None), torch.Tensor)


class ShardedLoader:
    """One rank's share of a dataset as batches; ``set_epoch`` reshuffles, ``skip_batches`` resumes."""

    def __init__(self, data: Dataset | DataLoader, batch_size: int, world_size: int, rank: int, shuffle: bool,
                 seed: int, num_workers: int = 0, pin_memory: bool = False) -> None:
        collate_fn = None
        if isinstance(data, DataLoader):
            # keep the user's dataset, batch size and collation; sharding is ours
            collate_fn = data.collate_fn
            batch_size = data.batch_size or batch_size
            num_workers = data.num_workers
            data = data.dataset
        self.dataset = data
        self.batch_size = batch_size
        self.world_size = world_size
        self.rank = rank
        self.sampler = ResumableSampler(DistributedSampler(data, num_replicas=world_size, rank=rank,
                                                           shuffle=shuffle, seed=seed, drop_last=False))
        # a private generator: creating an iterator must not draw from the global RNG, or a resumed
        # run (whose iterator starts after the RNG restore) would drift from the uninterrupted one
        generator = torch.Generator().manual_seed(seed + rank)
        if _holds_whole_tensors(data) and collate_fn is None:
            batches = BatchSampler(self.sampler, batch_size, drop_last=False)
            self.loader = DataLoader(_WholeBatches(data), sampler=batches, batch_size=None,
                                     num_workers=num_workers, pin_memory=pin_memory, generator=generator)
        else:
            self.loader = DataLoader(data, batch_size=batch_size, sampler=self.sampler, collate_fn=collate_fn,
                                     num_workers=num_workers, pin_memory=pin_memory, generator=generator)

    @property
    def dataset_size(self) -> int:
        """Items in the whole dataset (all ranks)."""
        assert isinstance(self.dataset, Sized), "a map-style dataset: DistributedSampler took its len()"
        return len(self.dataset)

    def batches_per_epoch(self) -> int:
        """Batches of this rank in a whole epoch (the same on every rank: the sampler pads)."""
        per_rank = len(self.sampler.inner)
        return -(-per_rank // self.batch_size)

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[tuple[Any, Any]]:
        """The batches of ``epoch``, starting after ``skip_batches`` already done."""
        self.sampler.set_epoch(epoch)
        self.sampler.skip = skip_batches * self.batch_size
        try:
            yield from self.loader
        finally:
            self.sampler.skip = 0


def to_device(value: Any, device: torch.device) -> Any:
    """Move a tensor, or a tuple/list of them, to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple | list):
        return type(value)(to_device(v, device) for v in value)
    return value


def as_arguments(features: Any) -> tuple[Any, ...]:
    """Model arguments: a tuple/list of tensors spreads into ``model(*features)``."""
    return tuple(features) if isinstance(features, tuple | list) else (features,)
