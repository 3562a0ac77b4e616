"""An in-memory dataset of ``(features, target)`` pairs held as whole tensors.

Every item is cut from tensors already in memory, so a DataLoader does no per-item decoding; the
Trainer may also read ``features`` / ``targets`` directly for whole-batch indexing.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

Features = torch.Tensor | tuple[torch.Tensor, ...]


class SizedDataset(Dataset):
    """A map-style dataset that has a length, as every workload's does (torch's ``Dataset`` declares no
    ``__len__``: samplers and the workloads' callers take it)."""

    def __len__(self) -> int:
        raise NotImplementedError


class TensorPairDataset(SizedDataset):
    """Items ``(features[i], targets[i])``; ``features`` may be a tuple of tensors (``model(*features)``)."""

    def __init__(self, features: Features, targets: torch.Tensor, classes: tuple[str, ...] = ()) -> None:
        parts = features if isinstance(features, tuple) else (features,)
        sizes = {len(p) for p in parts} | {len(targets)}
        if len(sizes) != 1:
            # an internal invariant: every parser builds aligned tensors
            raise AssertionError(f"features and targets differ in length: {sorted(sizes)}")
        self.features = features
        self.targets = targets
        self.classes = classes
        """Class names in label order (empty for regression)."""

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Features, torch.Tensor]:
        if isinstance(self.features, tuple):
            return tuple(p[index] for p in self.features), self.targets[index]
        return self.features[index], self.targets[index]

    def select(self, indices: torch.Tensor) -> TensorPairDataset:
        """A new dataset holding the given items, in the given order."""
        if isinstance(self.features, tuple):
            features: Features = tuple(p[indices] for p in self.features)
        else:
            features = self.features[indices]
        return TensorPairDataset(features, self.targets[indices], self.classes)

    def __repr__(self) -> str:
        parts = self.features if isinstance(self.features, tuple) else (self.features,)
        shapes = ", ".join(str(tuple(p.shape[1:])) for p in parts)
        return f"TensorPairDataset(items={len(self)}, features={shapes}, targets={self.targets.dtype})"


def take_subset(ds: TensorPairDataset, subset: int | None, seed: int) -> TensorPairDataset:
    """At most ``subset`` items chosen at random with ``seed`` (the same choice on every rank)."""
    if subset is None or subset >= len(ds):
        return ds
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(ds), generator=generator)[:subset]
    return ds.select(chosen.sort().values)


def check_subset(subset: int | None) -> None:
    """Reject a subset that is not a positive int."""
    if subset is None:
        return
    if isinstance(subset, bool) or not isinstance(subset, int) or subset < 1:
        raise ValueError(f"subset={subset!r} is not a positive number of items. HINT: pass e.g. subset=1000.")
