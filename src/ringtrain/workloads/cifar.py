"""CIFAR-10 from the "python version" pickle batches (``cifar-10-batches-py/``).

Each batch is a pickled dict: ``b'data'`` a uint8 array N x 3072 (1024 red, 1024 green, 1024 blue
values of a 32x32 image, row-major), ``b'labels'`` a list of N ints 0-9.
"""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import numpy as np
import torch

from ringtrain.exceptions import DataError
from ringtrain.workloads.base import DataPath, Defaults, Workload
from ringtrain.workloads.dataset import TensorPairDataset, check_subset, take_subset
from ringtrain.workloads.download import download as download_file
from ringtrain.workloads.download import write_atomic
from ringtrain.workloads.models.resnet import resnet18_cifar
from ringtrain.workloads.sources import DataSource, locate

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
LAYOUTS = ("cifar-10-batches-py", "cifar10/cifar-10-batches-py")

# The only globals a genuine batch refers to: numpy's array reconstruction (under its numpy 1 and
# numpy 2 module names). Anything else would let a planted file run code when unpickled.
_ALLOWED = {
    # Python 3 writes byte strings under protocol 2 as _codecs.encode calls (harmless)
    ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    # pickle protocol 5 rebuilds arrays from a buffer
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images ``N x 3 x 32 x 32`` uint8 and labels ``N`` int64 from one pickle batch."""
    hint = "HINT: use the files of cifar-10-python.tar.gz (the python version), not the binary version."
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DataError(f"CIFAR-10 batch {path} does not exist. {hint}") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, TypeError,
            ValueError) as err:
        raise DataError(f"{path} is not a CIFAR-10 python batch ({err}). {hint}") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{path} lacks b'data' / b'labels' (found {keys}). {hint}")
    data = batch[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", None)
        raise DataError(f"{path}: b'data' must be a uint8 array N x 3072, found {type(data).__name__} "
                        f"{shape} {getattr(data, 'dtype', '')}. {hint}")
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if labels.shape != (len(data),):
        raise DataError(f"{path}: {len(data)} images but {labels.size} labels. {hint}")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise DataError(f"{path}: labels outside 0-9 (min {labels.min()}, max {labels.max()}). {hint}")
    return data.reshape(-1, 3, 32, 32), labels


def _normalise(images: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(images).float().div_(255.0)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (x - mean) / std


def load_split(source: DataSource, names: tuple[str, ...]) -> TensorPairDataset:
    """Concatenate the named batches into one normalised dataset."""
    parts = [read_batch(source.file((name,))) for name in names]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return TensorPairDataset(_normalise(images), torch.from_numpy(labels), CLASSES)


def fetch(folder: Path, mirrors: tuple[str, ...] = MIRRORS, md5: str = ARCHIVE_MD5,
          progress: bool = True) -> None:
    """Download the archive next to ``folder`` (md5 verified) and unpack its batches into ``folder``."""
    archive = download_file([m + ARCHIVE for m in mirrors], folder.parent / ARCHIVE, md5, progress=progress)
    with tarfile.open(archive, "r:gz") as tar:
        # the archive holds cifar-10-batches-py/...; unpack only those regular files, flattened
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and name in (*TRAIN_BATCHES, TEST_BATCH, "batches.meta"):
                source = tar.extractfile(member)
                if source is not None:
                    write_atomic(folder / name, source.read())


class Cifar10Workload(Workload):
    """CIFAR-10 colour images with a CIFAR ResNet-18 (no data offline: pass data_dir or download)."""

    name = "cifar10"
    description = "CIFAR-10 images, ResNet-18 (3x3 stem)"
    defaults = Defaults(epochs=30, batch_size=128, lr=0.1, optimizer="sgd", momentum=0.9, weight_decay=5e-4)
    architectures = {"resnet18": resnet18_cifar}

    def __init__(self, mirrors: tuple[str, ...] = MIRRORS, md5: str = ARCHIVE_MD5) -> None:
        self.mirrors = mirrors
        self.md5 = md5
        self.source: DataSource | None = None

    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[TensorPairDataset, TensorPairDataset]:
        check_subset(subset)
        self.source = locate(
            "cifar10",
            [(n,) for n in (*TRAIN_BATCHES, TEST_BATCH)],
            layouts=LAYOUTS,
            data_dir=data_dir,
            cache_dir=cache_dir,
            download=download,
            fetch=lambda folder: fetch(folder, self.mirrors, self.md5),
        )
        train = load_split(self.source, TRAIN_BATCHES)
        test = load_split(self.source, (TEST_BATCH,))
        return take_subset(train, subset, seed), take_subset(test, subset, seed + 1)
