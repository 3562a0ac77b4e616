"""MNIST and Fashion-MNIST: 28x28 grey images in IDX files, 10 classes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ringtrain.exceptions import DataError
from ringtrain.workloads.base import DataPath, Defaults, Workload
from ringtrain.workloads.dataset import TensorPairDataset, check_subset, take_subset
from ringtrain.workloads.download import download as download_file
from ringtrain.workloads.idx import read_idx
from ringtrain.workloads.models.mnist_cnn import HorovodMnistNet, MnistCNN
from ringtrain.workloads.sources import DataSource, locate

EMBEDDED_MNIST = Path(__file__).resolve().parent / "embedded" / "mnist"
"""The real MNIST subset shipped in the package (see its README.md)."""

SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclass(frozen=True)
class IdxImageSet:
    """Everything that differs between MNIST-like datasets."""

    name: str
    mean: float
    std: float
    mirrors: tuple[str, ...]
    """Base URLs; a file's URL is the base plus its ``.gz`` name."""
    md5: dict[str, str]
    """Published md5 of each ``.gz`` file."""
    layouts: tuple[str, ...]
    """Sub-folders searched below a data folder; the first receives downloads."""
    classes: tuple[str, ...]
    embedded: Path | None = None
    """A folder inside the package holding a copy, used when nothing else is found."""


MNIST = IdxImageSet(
    name="mnist",
    mean=0.1307,
    std=0.3081,
    mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    md5={
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    layouts=("mnist", "MNIST/raw"),
    classes=tuple(str(d) for d in range(10)),
    embedded=EMBEDDED_MNIST,
)

FASHION_MNIST = IdxImageSet(
    name="fashion-mnist",
    mean=0.2860,
    std=0.3530,
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    md5={
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
    layouts=("fashion-mnist", "FashionMNIST/raw"),
    classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
             "Ankle boot"),
)


def _requirements() -> list[tuple[str, ...]]:
    return [(f"{n}.gz", n) for pair in SPLIT_FILES.values() for n in pair]


def load_split(source: DataSource, split: str, spec: IdxImageSet) -> TensorPairDataset:
    """One split as normalised float images ``N x 1 x 28 x 28`` and int64 labels."""
    image_name, label_name = SPLIT_FILES[split]
    images_path = source.file((f"{image_name}.gz", image_name))
    labels_path = source.file((f"{label_name}.gz", label_name))
    images = read_idx(images_path, expect_ndim=3)
    labels = read_idx(labels_path, expect_ndim=1)
    if images.dtype != torch.uint8 or labels.dtype != torch.uint8:
        raise DataError(f"{images_path} / {labels_path} do not hold uint8 data. "
                        "HINT: use the original MNIST-format files.")
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds "
                        f"{len(labels)} labels. HINT: the two files come from different releases or one "
                        "is damaged; copy both again.")
    if labels.numel() and int(labels.max()) >= len(spec.classes):
        raise DataError(f"{labels_path} has label {int(labels.max())}, but {spec.name} has "
                        f"{len(spec.classes)} classes. HINT: use the {spec.name} label file.")
    features = ((images.float() / 255.0 - spec.mean) / spec.std).unsqueeze(1)
    return TensorPairDataset(features, labels.long(), spec.classes)


def fetch(spec: IdxImageSet, folder: Path, progress: bool = True) -> None:
    """Download the four ``.gz`` files of ``spec`` into ``folder``, md5 verified."""
    for name, md5 in spec.md5.items():
        download_file([base + name for base in spec.mirrors], folder / name, md5, progress=progress)


class IdxImageWorkload(Workload):
    """Shared behaviour of the MNIST-like workloads."""

    spec: IdxImageSet

    def __init__(self, spec: IdxImageSet | None = None) -> None:
        # a spec may be replaced (e.g. with local mirrors) for tests or private mirrors
        if spec is not None:
            self.spec = spec
        self.source: DataSource | None = None
        """Where the last ``datasets()`` call found its files."""

    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[TensorPairDataset, TensorPairDataset]:
        check_subset(subset)
        spec = self.spec
        self.source = locate(
            spec.name,
            _requirements(),
            layouts=spec.layouts,
            data_dir=data_dir,
            cache_dir=cache_dir,
            download=download,
            fetch=lambda folder: fetch(spec, folder),
            embedded=spec.embedded,
        )
        train = load_split(self.source, "train", spec)
        test = load_split(self.source, "test", spec)
        return take_subset(train, subset, seed), take_subset(test, subset, seed + 1)


class MnistWorkload(IdxImageWorkload):
    """Handwritten digits; works offline from the embedded real subset."""

    name = "mnist"
    spec = MNIST
    description = "MNIST digits, small CNN (offline: embedded 10k/2k real subset)"
    defaults = Defaults(epochs=4, batch_size=64, lr=1e-3, optimizer="adam")
    architectures = {"cnn": MnistCNN, "horovod": HorovodMnistNet}


class FashionMnistWorkload(IdxImageWorkload):
    """Zalando's clothing images in the MNIST format."""

    name = "fashion-mnist"
    spec = FASHION_MNIST
    description = "Fashion-MNIST clothing images, small CNN"
    defaults = Defaults(epochs=5, batch_size=64, lr=1e-3, optimizer="adam")
    architectures = {"cnn": MnistCNN, "horovod": HorovodMnistNet}
