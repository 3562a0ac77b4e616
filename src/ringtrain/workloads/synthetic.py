"""Synthetic data, generated in memory from a seed: images of any shape, and ratings.

Both are learnable but not trivial, so a run shows accuracy rising over epochs (or RMSE falling)
without reaching perfection at once. An image is a coarse random pattern (4x4 cells per channel,
scaled up) plus pixel noise; its label comes from a fixed random teacher network that looks at the
pattern, sampled with some randomness (a softmax at ``label_temperature``), so even a perfect model
scores below 100%. A rating comes from hidden user and item factors plus noise.

Every image is drawn from a seed of its own (the run's seed, its split, its index), so any item can
be made on demand: small sets are made whole in memory, large ones (ImageNet-shaped) item by item
as the data loader asks, and both give the same items.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ringtrain.workloads.base import DataPath, Defaults, Workload
from ringtrain.workloads.dataset import SizedDataset, TensorPairDataset, check_subset, take_subset
from ringtrain.workloads.models.conv import SmallConvNet
from ringtrain.workloads.models.recommender import BiasedMF, NeuralCF
from ringtrain.workloads.models.resnet import resnet18_cifar

#: ``like=`` names: the image shape, number of classes and train/test item counts of a real data set.
LIKE: dict[str, tuple[tuple[int, int, int], int, int, int]] = {
    "mnist": ((1, 28, 28), 10, 60_000, 10_000),
    "cifar10": ((3, 32, 32), 10, 50_000, 10_000),
    "imagenet": ((3, 224, 224), 1000, 1_281_167, 50_000),
}

#: A split larger than this many bytes of pixels is made item by item rather than held in memory.
IN_MEMORY_BYTES = 256 * 1024 * 1024

_MASK64 = (1 << 64) - 1
_TRAIN, _TEST, _TEACHER = 0, 1, 2


def _warn_unused(data_dir: DataPath, download: bool, cache_dir: DataPath) -> None:
    if data_dir is not None or download or cache_dir is not None:
        warnings.warn("synthetic data is generated in memory: data_dir, download and cache_dir "
                      "have no effect", stacklevel=3)


def _positive(**values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r} must be a positive int. HINT: pass e.g. {key}=10.")


def _seed_of(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (splitmix64 over the parts): no two items share one."""
    state = 0
    for part in parts:
        state = (state ^ (part & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        z = (state ^ (state >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


class Teacher:
    """A fixed random two-layer network from an image's coarse pattern to class scores.

    Its scores are standardised per class (over a reference sample), so every class is about as
    frequent; ``width`` hidden units keep the rule smooth enough to learn from a few epochs.
    """

    def __init__(self, inputs: int, num_classes: int, seed: int, width: int | None = None) -> None:
        width = width or max(16, 2 * math.ceil(math.sqrt(num_classes)))
        g = torch.Generator().manual_seed(_seed_of(seed, _TEACHER))
        self.w1 = torch.randn(inputs, width, generator=g) / math.sqrt(inputs)
        self.b1 = 0.5 * torch.randn(width, generator=g)
        self.w2 = torch.randn(width, num_classes, generator=g) / math.sqrt(width)
        reference = self._raw(torch.randn(4096, inputs, generator=g))
        self.mean, self.std = reference.mean(0), reference.std(0).clamp_min(1e-6)

    def _raw(self, latent: torch.Tensor) -> torch.Tensor:
        return torch.tanh(latent @ self.w1 + self.b1) @ self.w2

    def scores(self, latent: torch.Tensor) -> torch.Tensor:
        """Standardised class scores of flattened patterns ``(n, inputs)``."""
        return (self._raw(latent) - self.mean) / self.std


class SyntheticImages(SizedDataset):
    """The items of one split, made on demand from their own seeds (see the module's docstring)."""

    def __init__(self, workload: SyntheticImagesWorkload, split: int, size: int, seed: int) -> None:
        self.workload, self.split, self.size, self.seed = workload, split, size, seed
        self.teacher = workload.teacher(seed)
        self.classes = tuple(f"class{i}" for i in range(workload.num_classes))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(f"item {index} of {self.size}")
        w = self.workload
        g = torch.Generator().manual_seed(_seed_of(self.seed, self.split, index))
        channels, height, width = w.shape
        latent = torch.randn((1, channels, *w.grid), generator=g)
        gumbel = -torch.log(-torch.log(torch.rand(w.num_classes, generator=g).clamp(1e-12, 1 - 1e-7)))
        scores = self.teacher.scores(latent.flatten(1))[0]
        label = torch.argmax(scores / w.label_temperature + gumbel)
        image = F.interpolate(latent, size=(height, width), mode="nearest")[0]
        image = image + w.noise * torch.randn(w.shape, generator=g)
        return image, label

    def in_memory(self) -> TensorPairDataset:
        """All items as one in-memory dataset (the same items, indexed whole batches at a time)."""
        items = [self[i] for i in range(self.size)]
        images = torch.stack([image for image, _ in items])
        labels = torch.stack([label for _, label in items])
        return TensorPairDataset(images, labels, self.classes)


class SyntheticImagesWorkload(Workload):
    """Images of any ``shape`` (C, H, W) in ``num_classes`` classes labelled by a random teacher network.

    ``like="cifar10"`` (or ``"mnist"``, ``"imagenet"``) takes the shape, classes and item counts of
    that data set; the default is CIFAR-shaped (3x32x32, 10 classes) with 10,000 training items, a run
    of about a minute on two CPU cores. ``noise`` is the pixel noise's standard deviation and
    ``label_temperature`` how far labels stray from the teacher's choice (0 would never stray).
    """

    name = "synthetic"
    description = "synthetic images labelled by a random teacher network, small CNN"
    defaults = Defaults(epochs=5, batch_size=64, lr=0.01, optimizer="sgd", momentum=0.9)

    def __init__(self, shape: tuple[int, int, int] | None = None, num_classes: int | None = None,
                 size: int | None = None, test_size: int | None = None, noise: float = 0.5,
                 label_temperature: float = 0.15, like: str | None = None) -> None:
        if like is not None and like not in LIKE:
            raise ValueError(f"like={like!r} is not a data set whose sizes are known. "
                             f"HINT: use one of {sorted(LIKE)}, or give shape and num_classes.")
        like_shape, like_classes, like_size, like_test = LIKE[like] if like else LIKE["cifar10"]
        if like is None:  # CIFAR-shaped, but small enough for a run of about a minute
            like_size, like_test = 10_000, 2_000
        dims = tuple(shape) if shape is not None else like_shape
        if len(dims) != 3:
            raise ValueError(f"shape={dims} must be (channels, height, width). HINT: pass e.g. (3, 32, 32).")
        self.num_classes = num_classes if num_classes is not None else like_classes
        self.size = size if size is not None else like_size
        _positive(channels=dims[0], height=dims[1], width=dims[2], num_classes=self.num_classes,
                  size=self.size)
        self.shape: tuple[int, int, int] = (int(dims[0]), int(dims[1]), int(dims[2]))
        if test_size is None:
            test_size = like_test if size is None else max(1, self.size // 5)
        self.test_size = test_size
        _positive(test_size=self.test_size)
        if not (noise >= 0 and math.isfinite(noise)):
            raise ValueError(f"noise={noise!r} must be a finite number >= 0. HINT: pass e.g. noise=0.5.")
        if not (label_temperature > 0 and math.isfinite(label_temperature)):
            raise ValueError(f"label_temperature={label_temperature!r} must be positive. "
                             "HINT: pass e.g. label_temperature=0.15 (smaller: cleaner labels).")
        self.noise = float(noise)
        self.label_temperature = float(label_temperature)
        self.like = like
        self.grid = (min(self.shape[1], 4), min(self.shape[2], 4))
        """Cells of the coarse pattern per channel (rows, columns)."""
        self.architectures = {
            "cnn": lambda: SmallConvNet(self.shape[0], self.num_classes),
            "resnet18": lambda: resnet18_cifar(self.num_classes, self.shape[0]),
        }

    def teacher(self, seed: int) -> Teacher:
        """The labelling network of the run with ``seed``."""
        return Teacher(self.shape[0] * self.grid[0] * self.grid[1], self.num_classes, seed)

    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[SizedDataset, SizedDataset]:
        check_subset(subset)
        _warn_unused(data_dir, download, cache_dir)
        n_train = min(self.size, subset or self.size)
        n_test = min(self.test_size, subset or self.test_size)
        train = SyntheticImages(self, _TRAIN, n_train, seed)
        test = SyntheticImages(self, _TEST, n_test, seed)
        return self._held(train), self._held(test)

    def _held(self, split: SyntheticImages) -> SizedDataset:
        """In memory when it fits (whole-batch indexing is faster), else made item by item."""
        if split.size * 4 * math.prod(self.shape) <= IN_MEMORY_BYTES:
            return split.in_memory()
        return split


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

    def _build(self, constructor: Callable[..., nn.Module]) -> nn.Module:
        return constructor(self.num_users, self.num_items, global_mean=self.mean_rating)
