"""MNIST and Fashion-MNIST: real files, the embedded subset, normalisation, wrong files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.workloads import DataError, get_workload
from ringtrain.workloads.embedded_subset import TEST_ITEMS, TRAIN_ITEMS
from ringtrain.workloads.idx import read_idx, write_idx


def test_real_mnist_from_the_shared_folder(shared_data: Path) -> None:
    wl = get_workload("mnist")
    train, test = wl.datasets(data_dir=shared_data)
    assert wl.source is not None
    assert wl.source.kind == "data_dir"
    assert (len(train), len(test)) == (60000, 10000)
    assert train.features.shape == (60000, 1, 28, 28)
    assert train.features.dtype == torch.float32
    assert train.targets.dtype == torch.int64
    assert train.targets[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    # normalised with the usual MNIST mean and std: the whole training set comes out near N(0, 1)
    assert abs(train.features.mean().item()) < 1e-3
    assert abs(train.features.std().item() - 1.0) < 1e-3
    image, label = train[0]
    assert image.shape == (1, 28, 28)
    assert label.item() == 5


def test_real_fashion_mnist(shared_data: Path) -> None:
    wl = get_workload("fashion-mnist")
    train, test = wl.datasets(data_dir=shared_data / "fashion-mnist")
    assert (len(train), len(test)) == (60000, 10000)
    assert torch.bincount(train.targets).tolist() == [6000] * 10
    assert train.classes[9] == "Ankle boot"
    assert abs(train.features.mean().item()) < 1e-2


def test_embedded_subset_is_used_offline() -> None:
    wl = get_workload("mnist")
    train, test = wl.datasets()
    assert wl.source is not None
    assert wl.source.kind == "embedded"
    assert (len(train), len(test)) == (TRAIN_ITEMS, TEST_ITEMS) == (10000, 2000)
    assert train.targets[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert test.targets[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert torch.bincount(train.targets, minlength=10).min() > 800  # every digit well represented


def _write_mnist(folder: Path, train: int = 20, test: int = 10, gz: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    for prefix, count in (("train", train), ("t10k", test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}",
                  rng.integers(0, 256, (count, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(count, dtype=np.uint8) % 10)


@pytest.mark.parametrize("gz", [True, False])
def test_small_files_written_here(tmp_path: Path, gz: bool) -> None:
    _write_mnist(tmp_path, gz=gz)
    train, test = get_workload("mnist").datasets(data_dir=tmp_path)
    assert (len(train), len(test)) == (20, 10)
    raw = read_idx(tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else "")))
    expected = (raw.float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(train.features[:, 0], expected)


@pytest.mark.parametrize("layout", ["", "mnist", "MNIST/raw"])
def test_data_dir_layouts(tmp_path: Path, layout: str) -> None:
    _write_mnist(tmp_path / layout)
    wl = get_workload("mnist")
    train, _ = wl.datasets(data_dir=tmp_path)
    assert len(train) == 20
    assert wl.source is not None
    assert wl.source.folder == tmp_path / layout


def test_images_and_labels_of_different_lengths(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(9, dtype=np.uint8))
    with pytest.raises(DataError, match="10 images but .* 9 labels"):
        get_workload("mnist").datasets(data_dir=tmp_path)


def test_images_file_swapped_with_labels(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    shutil.copy(tmp_path / "train-labels-idx1-ubyte.gz", tmp_path / "train-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz has 1 dimensions, expected 3"):
        get_workload("mnist").datasets(data_dir=tmp_path)


def test_labels_beyond_the_classes(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(10, 12, dtype=np.uint8))
    with pytest.raises(DataError, match="label 12"):
        get_workload("mnist").datasets(data_dir=tmp_path)


def test_subset_is_seeded_and_the_same_for_every_caller() -> None:
    wl = get_workload("mnist")
    a_train, a_test = wl.datasets(subset=300, seed=1)
    b_train, _ = wl.datasets(subset=300, seed=1)
    c_train, _ = wl.datasets(subset=300, seed=2)
    assert (len(a_train), len(a_test)) == (300, 300)
    assert torch.equal(a_train.features, b_train.features)
    assert not torch.equal(a_train.targets, c_train.targets)


@pytest.mark.parametrize("bad", [0, -5, 2.5, "100", True])
def test_bad_subset(bad: object) -> None:
    with pytest.raises(ValueError, match="subset="):
        get_workload("mnist").datasets(subset=bad)  # type: ignore[arg-type]
