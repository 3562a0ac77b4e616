"""Synthetic data, generated in memory from a seed: images of any shape, and ratings.

Both are learnable (not pure noise), so a short run shows the loss falling: an image is its class's
fixed random pattern plus noise; a rating comes from hidden user and item factors plus noise.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ringtrain.workloads.base import DataPath, Defaults, Workload
from ringtrain.workloads.dataset import TensorPairDataset, check_subset, take_subset
from ringtrain.workloads.models.conv import SmallConvNet
from ringtrain.workloads.models.recommender import BiasedMF, NeuralCF
from ringtrain.workloads.models.resnet import resnet18_cifar


def _warn_unused(data_dir: DataPath, download: bool, cache_dir: DataPath) -> None:
    if data_dir is not None or download or cache_dir is not None:
        warnings.warn("synthetic data is generated in memory: data_dir, download and cache_dir "
                      "have no effect", stacklevel=3)


def _positive(**values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r} must be a positive int. HINT: pass e.g. {key}=10.")


def synthetic_images(size: int, shape: tuple[int, int, int], num_classes: int, noise: float,
                     seed: int) -> TensorPairDataset:
    """``size`` images: class pattern (fixed by ``seed``) plus Gaussian noise of std ``noise``."""
    generator = torch.Generator().manual_seed(seed)
    channels, height, width = shape
    # smooth patterns (a coarse grid of at most 4x4 values, scaled up) that convolutions and
    # pooling keep, where per-pixel patterns would be averaged away with the noise
    coarse = torch.randn((num_classes, channels, min(height, 4), min(width, 4)), generator=generator)
    patterns = F.interpolate(coarse, size=(height, width), mode="nearest")
    labels = torch.randint(num_classes, (size,), generator=generator)
    images = patterns[labels] + noise * torch.randn((size, *shape), generator=generator)
    return TensorPairDataset(images, labels, tuple(f"class{i}" for i in range(num_classes)))


class SyntheticImagesWorkload(Workload):
    """Random images in ``num_classes`` classes, any ``shape`` (C, H, W); for benchmarks and smoke tests."""

    name = "synthetic"
    description = "synthetic images (class pattern + noise), small CNN"
    defaults = Defaults(epochs=2, batch_size=64, lr=0.01, optimizer="sgd", momentum=0.9)

    def __init__(self, shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10, size: int = 10_000,
                 test_size: int | None = None, noise: float = 1.0) -> None:
        if len(shape) != 3:
            raise ValueError(f"shape={shape} must be (channels, height, width). HINT: pass e.g. (3, 32, 32).")
        _positive(channels=shape[0], height=shape[1], width=shape[2], num_classes=num_classes, size=size)
        self.shape = tuple(shape)
        self.num_classes = num_classes
        self.size = size
        self.test_size = max(1, size // 5) if test_size is None else test_size
        _positive(test_size=self.test_size)
        self.noise = noise
        self.architectures = {
            "cnn": lambda: SmallConvNet(self.shape[0], self.num_classes),
            "resnet18": lambda: resnet18_cifar(self.num_classes, self.shape[0]),
        }

    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[TensorPairDataset, TensorPairDataset]:
        check_subset(subset)
        _warn_unused(data_dir, download, cache_dir)
        n_train = min(self.size, subset or self.size)
        n_test = min(self.test_size, subset or self.test_size)
        # one generator for both splits, so test items share the train items' class patterns
        everything = synthetic_images(n_train + n_test, self.shape, self.num_classes, self.noise, seed)
        split = torch.arange(n_train + n_test)
        return everything.select(split[:n_train]), everything.select(split[n_train:])


class SyntheticRatingsWorkload(Workload):
    """Random (user, item) -> rating data from hidden low-rank factors; the MovieLens code path offline."""

    name = "synthetic-ratings"
    task = "regression"
    description = "synthetic ratings (low-rank + noise), biased matrix factorisation"
    defaults = Defaults(epochs=5, batch_size=256, lr=5e-3, optimizer="adam")
    architectures = {"mf": BiasedMF, "ncf": NeuralCF}

    def __init__(self, num_users: int = 1000, num_items: int = 500, size: int = 50_000, rank: int = 8,
                 noise: float = 0.5) -> None:
        _positive(num_users=num_users, num_items=num_items, size=size, rank=rank)
        self.num_users = num_users
        self.num_items = num_items
        self.size = size
        self.rank = rank
        self.noise = noise
        self.mean_rating = 3.5

    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[TensorPairDataset, TensorPairDataset]:
        check_subset(subset)
        _warn_unused(data_dir, download, cache_dir)
        g = torch.Generator().manual_seed(seed)
        users = torch.randint(self.num_users, (self.size,), generator=g)
        items = torch.randint(self.num_items, (self.size,), generator=g)
        p = torch.randn(self.num_users, self.rank, generator=g) / self.rank**0.5
        q = torch.randn(self.num_items, self.rank, generator=g) / self.rank**0.5
        user_bias = 0.5 * torch.randn(self.num_users, generator=g)
        item_bias = 0.5 * torch.randn(self.num_items, generator=g)
        clean = self.mean_rating + user_bias[users] + item_bias[items] + (p[users] * q[items]).sum(-1)
        ratings = (clean + self.noise * torch.randn(self.size, generator=g)).clamp(0.5, 5.0)
        full = TensorPairDataset((users, items), ratings)
        n_test = max(1, self.size // 5)
        train, test = full.select(torch.arange(n_test, self.size)), full.select(torch.arange(n_test))
        return take_subset(train, subset, seed), take_subset(test, subset, seed + 1)

    def _build(self, constructor: type[nn.Module]) -> nn.Module:
        return constructor(self.num_users, self.num_items, global_mean=self.mean_rating)
