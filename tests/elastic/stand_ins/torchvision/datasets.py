"""``MNIST(root, train, download, transform)`` over the idx files in ``<root>/MNIST/raw``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from ringtrain.workloads.idx import read_idx


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root: str, train: bool = True, download: bool = False,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        raw = Path(root) / "MNIST" / "raw"
        prefix = "train" if train else "t10k"
        self.images = read_idx(raw / f"{prefix}-images-idx3-ubyte.gz", expect_ndim=3)
        self.targets = read_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", expect_ndim=1).long()
        limit = int(os.environ.get("RINGTRAIN_TEST_MNIST_LIMIT", "0"))
        if limit:
            self.images, self.targets = self.images[:limit], self.targets[:limit]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])
