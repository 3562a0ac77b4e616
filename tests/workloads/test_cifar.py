"""CIFAR-10 from batches written here in the real pickle layout (the real files are not available)."""

from __future__ import annotations

import os
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.workloads import DataError, get_workload
from ringtrain.workloads.cifar import MEAN, STD, Cifar10Workload, read_batch
from ringtrain.workloads.download import md5sum
from tests.workloads.helpers import serve_folder, write_cifar10, write_cifar_batch


def test_reads_the_pickle_layout(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path, per_batch=8, test_items=6)
    wl = get_workload("cifar10")
    train, test = wl.datasets(data_dir=tmp_path)
    assert wl.source is not None
    assert wl.source.folder == folder
    assert (len(train), len(test)) == (40, 6)
    assert train.features.shape == (40, 3, 32, 32)
    assert train.targets.dtype == torch.int64
    assert train.classes[0] == "airplane"
    # the first training image, channel by channel, equals the first row of data_batch_1
    raw = pickle.loads((folder / "data_batch_1").read_bytes(), encoding="bytes")
    red = raw[b"data"][0, :1024].reshape(32, 32) / 255.0
    assert torch.allclose(train.features[0, 0], torch.from_numpy((red - MEAN[0]) / STD[0]).float(), atol=1e-5)
    assert train.targets[:8].tolist() == raw[b"labels"]


def test_batches_concatenate_in_order(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path, per_batch=3)
    train, _ = get_workload("cifar10").datasets(data_dir=folder)
    labels = []
    for i in range(1, 6):
        labels += pickle.loads((folder / f"data_batch_{i}").read_bytes(), encoding="bytes")[b"labels"]
    assert train.targets.tolist() == labels


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_protocols(tmp_path: Path, protocol: int) -> None:
    images = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3, 32, 32)
    write_cifar_batch(tmp_path / "b", images, [3, 9], protocol=protocol)
    data, labels = read_batch(tmp_path / "b")
    assert np.array_equal(data, images)
    assert labels.tolist() == [3, 9]


def test_numpy1_module_names_are_accepted(tmp_path: Path) -> None:
    # the published batches name numpy.core.multiarray, as numpy 1 did
    images = np.zeros((1, 3, 32, 32), dtype=np.uint8)
    write_cifar_batch(tmp_path / "b", images, [1])
    raw = (tmp_path / "b").read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    (tmp_path / "b").write_bytes(raw)
    assert read_batch(tmp_path / "b")[1].tolist() == [1]


class _Planted:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo planted > planted.txt",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b").write_bytes(pickle.dumps({b"data": _Planted(), b"labels": []}))
    with pytest.raises(DataError, match="not a CIFAR-10 python batch"):
        read_batch(tmp_path / "b")
    assert not (tmp_path / "planted.txt").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a pickle at all", "not a CIFAR-10 python batch"),
        (pickle.dumps([1, 2, 3]), "lacks b'data'"),
        (pickle.dumps({"data": 1, "labels": 2}), "lacks b'data'"),
        (pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}), "N x 3072"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}), "N x 3072"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "2 images but 1 labels"),
        (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}), "labels outside 0-9"),
    ],
)
def test_wrong_files(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "b").write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        read_batch(tmp_path / "b")
    assert str(tmp_path / "b") in str(info.value)
    assert "HINT:" in str(info.value)


def test_a_missing_batch(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match="does not hold the cifar10 files"):
        get_workload("cifar10").datasets(data_dir=tmp_path)


def test_no_data_anywhere_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="download=True"):
        get_workload("cifar10").datasets()


def test_download_and_unpack_the_archive(tmp_path: Path, isolated_cache: Path) -> None:
    write_cifar10(tmp_path / "src", per_batch=4, test_items=4)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    archive = mirror / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    with serve_folder(mirror) as url:
        wl = Cifar10Workload(mirrors=(url,), md5=md5sum(archive))
        train, test = wl.datasets(download=True)
    assert (len(train), len(test)) == (20, 4)
    assert wl.source is not None
    assert wl.source.kind == "download"
    assert (isolated_cache / "cifar-10-batches-py" / "test_batch").is_file()
    shutil.rmtree(mirror)
    again = get_workload("cifar10")
    again.datasets()
    assert again.source is not None
    assert again.source.kind == "cache"


def test_subset(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=8)
    train, test = get_workload("cifar10").datasets(data_dir=tmp_path, subset=5)
    assert (len(train), len(test)) == (5, 5)
